"""Stopping a broker waits for the process to be gone, not for its command line to change.

An exiting JVM's /proc cmdline reads empty while it still holds its ports and data files; a wait
that re-checked "is this still a Kafka broker" returned then, so ``down`` left a live process
behind and a restart found its port taken. These tests use plain processes: their command lines
never match a broker's, which is the state an exiting broker is in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infra import broker_process

_SLEEP = [sys.executable, "-c", "import time; time.sleep({})"]


def _spawn(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([_SLEEP[0], _SLEEP[1], _SLEEP[2].format(seconds)])


def test_the_wait_returns_only_after_the_process_has_exited() -> None:
    proc = _spawn(1.0)
    try:
        left = broker_process.wait_gone({proc.pid: Path("/nonexistent/server.properties")}, 20.0)
        assert left == {}
        assert proc.poll() is not None, "the wait returned while the process still ran"
    finally:
        proc.kill()
        proc.wait()


def test_a_process_alive_at_the_deadline_is_returned() -> None:
    proc = _spawn(60.0)
    props = Path("/nonexistent/server.properties")
    try:
        assert broker_process.wait_gone({proc.pid: props}, 0.3) == {proc.pid: props}
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_or_vanished_pid_counts_as_gone() -> None:
    proc = _spawn(0.0)
    while broker_process.start_time(proc.pid) is not None:  # exits, stays a zombie until reaped
        pass
    assert broker_process.wait_gone({proc.pid: Path("x")}, 5.0) == {}
    proc.wait()
    assert broker_process.wait_gone({proc.pid: Path("x")}, 5.0) == {}
