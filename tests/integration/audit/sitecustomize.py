"""Test-only: loads the connect audit in every Python process started with this directory
on ``PYTHONPATH`` (the hostile tests' workers). See ``connect_audit``."""

import connect_audit

connect_audit.install_in_child()
