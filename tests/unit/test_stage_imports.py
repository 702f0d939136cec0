"""A stage process does not import aiokafka at start-up: only a worker that leaves its group
by instance id needs it (streams.group_leave), and every crawl starts four stage processes
at once on two cores, where ~30 ms of imports each is start-up the first request waits for.
The leave itself still builds its request (the class is made on first use)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_stage_processes_start_without_aiokafka() -> None:
    code = textwrap.dedent("""
        import sys
        import crawlfleet.worker_main, consumers.fetch.stage, consumers.parse, consumers.retry
        import consumers.store
        before = "aiokafka" in sys.modules
        from streams.group_leave import _leave_request
        req = _leave_request()("g", ["fetch-0"])
        print(before, req.API_KEY, req.instances)
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "13", "['fetch-0']"], out.stdout
