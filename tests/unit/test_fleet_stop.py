"""Stopping a fleet: an analytics worker that has joined its group gets its grace to stop
cleanly; one that has not yet (a faust app still starting) is killed at once -- it has read
nothing, and its start-up would take the whole grace from every crawl's teardown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from core.config import Settings, load_settings
from crawlfleet.fleet import Fleet, Plan

# Stops 0.3 s after its SIGTERM, within ANALYTICS_STOP_S: exit 0 if given the time.
STOPS_LATE = ("import signal, sys, time\n"
              "def bye(*_):\n    time.sleep(0.3)\n    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(30)\n")


def _worker(fleet: Fleet, wid: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", STOPS_LATE], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "up"
    fleet.procs[wid] = p
    return p


def _status(s: Settings, worker: str, assignment: list[list[object]]) -> None:
    s.status_dir.mkdir(parents=True, exist_ok=True)
    (s.status_dir / f"quarantine-{worker}.json").write_text(json.dumps(
        {"worker": worker, "stage": "quarantine", "assignment": assignment}))


def test_only_a_joined_analytics_worker_gets_its_grace(tmp_path: Path) -> None:
    s = load_settings(data_dir=tmp_path / "data", topic_prefix="stop-test.")
    fleet = Fleet(s, Plan(), tmp_path / "logs")
    # The one still starting is waited for first: given any grace, it would stop cleanly.
    starting = _worker(fleet, "quarantine-1")
    joined = _worker(fleet, "quarantine-0")
    _status(s, "quarantine-1", [])  # written at its start, before any assignment
    _status(s, "quarantine-0", [["stop-test.crawl.blocks", 0]])
    fleet.stop()
    assert joined.returncode == 0, "the joined worker stopped cleanly within its grace"
    assert starting.returncode == -9, "the worker still starting was killed at once"
