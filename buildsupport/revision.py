"""Writes the build's code revision into the wheel: ``core/_build_revision.py``.

An installed wheel has no checkout to read its commit from, so without this every build of
one version reads alike (``0.1.0``). The revision is ``CRAWLFLEET_BUILD_REVISION`` when set
(an image built from a tree without ``.git``: ``--build-arg``), else the commit ``git``
sees in the source tree (12 hex digits, ``+dirty`` when tracked files differ from it).
Only regular builds carry it: an editable install runs from the checkout, whose commit
``core.versions`` reads at run time. The file goes into the build directory, never into
the source tree.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from setuptools.command.build_py import build_py

ENV = "CRAWLFLEET_BUILD_REVISION"
MODULE = Path("core") / "_build_revision.py"
CHARS = 12  # as core.versions.REVISION_CHARS


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "--no-optional-locks", *args], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def build_revision() -> str | None:
    """This build's code revision, or None when neither the environment nor git says."""
    given = os.environ.get(ENV, "").strip()
    if given:
        return given
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return head[:CHARS] + ("+dirty" if dirty else "")


class BuildPy(build_py):  # type: ignore[misc]
    """setuptools' build_py, then the revision module beside the built ``core``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        revision = build_revision()
        if revision is None:
            return
        target = Path(self.build_lib) / MODULE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text('"""Written at build time by buildsupport.revision."""\n\n'
                          f"REVISION = {revision!r}\n")
