"""infra/RUNBOOK.md names only commands that exist, and each is run by a test as typed."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from crawlfleet.cli import app

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "infra" / "RUNBOOK.md"
#: command → (test file, the invocation it contains)
COVERED = {
    "top": ("tests/integration/test_top.py", "crawlfleet.cli top"),
    "sql": ("tests/integration/test_dashboards.py", '"sql", "--view"'),
    "dashboard": ("tests/integration/test_dashboard_browser.py", '"dashboard", "--port"'),
    "trace": ("tests/integration/test_trace.py", '"crawlfleet.cli", "trace"'),
    "doctor": ("tests/integration/test_doctor.py", '"doctor"'),
    "pause": ("tests/integration/test_cli_newcomer.py", '["pause"'),
    "cap": ("tests/integration/test_cli_newcomer.py", '["cap"'),
    "resume": ("tests/integration/test_cli_newcomer.py", '"resume"'),
    "dlq list": ("tests/integration/test_cli_newcomer.py", '"dlq", "list"'),
    "dlq show": ("tests/integration/test_cli_newcomer.py", '"dlq", "show"'),
    "dlq replay": ("tests/integration/test_cli_newcomer.py", '"dlq", "replay"'),
    "approve": ("tests/integration/test_approved_versions.py", '_cli(s, "approve"'),
    "approved": ("tests/integration/test_approved_versions.py", '_cli(s, "approved")'),
    "revoke": ("tests/integration/test_approved_versions.py", '_cli(s, "revoke"'),
    "unquarantine": ("tests/integration/test_quarantine_app.py", '"unquarantine", C]'),
    "schema": ("tests/unit/test_cluster_schema.py", '["schema", "--cluster"'),
}


def _named() -> set[str]:
    """Commands in the runbook's code blocks (``crawlfleet CMD [SUB]``)."""
    blocks = re.findall(r"```sh\n(.*?)```", RUNBOOK.read_text(), re.S)
    out = set()
    for line in "\n".join(blocks).splitlines():
        m = re.match(r"\s*crawlfleet ([a-z-]+)(?: ([a-z-]+))?", line)
        if m:
            out.add(f"{m[1]} {m[2]}" if m[1] == "dlq" and m[2] else m[1])
    return out


def test_every_runbook_command_exists_and_is_run_by_a_test() -> None:
    named = _named()
    assert {"pause", "resume", "cap", "dlq replay", "top"} <= named
    root = typer.main.get_command(app)
    for cmd in sorted(named):
        group: object = root
        for w in cmd.split():
            commands = getattr(group, "commands", {})
            assert w in commands, f"the runbook names `crawlfleet {cmd}`, which does not exist"
            group = commands[w]
        assert cmd in COVERED, f"the runbook names `crawlfleet {cmd}`: add the test running it"
        path, marker = COVERED[cmd]
        assert marker in (REPO / path).read_text(), f"{path} does not run `crawlfleet {cmd}`"
