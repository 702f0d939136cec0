"""Default worker ids: stable across restarts, never shared by two live workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from streams.worker import release_worker_name, worker_name

HOST = socket.gethostname()


def test_an_explicit_id_wins(tmp_path: Path) -> None:
    assert worker_name("fetch", "fetch-7", tmp_path) == "fetch-7"
    assert not list(tmp_path.iterdir())  # no slot taken


def test_live_workers_get_distinct_slots_and_a_freed_slot_is_reused(tmp_path: Path) -> None:
    a = worker_name("fetch", None, tmp_path)
    b = worker_name("fetch", None, tmp_path)
    other_stage = worker_name("parse", None, tmp_path)
    try:
        assert (a, b) == (f"{HOST}-fetch-0", f"{HOST}-fetch-1")
        assert other_stage == f"{HOST}-parse-0"
        release_worker_name(a)  # the worker holding slot 0 is gone
        again = worker_name("fetch", None, tmp_path)
        assert again == a  # its successor gets its id (and its state) back
    finally:
        for name in (a, b, other_stage):
            release_worker_name(name)


def test_a_dead_process_releases_its_slot(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; "
        "from streams.worker import worker_name; "
        "print(worker_name('store', None, Path(sys.argv[1])), flush=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        held = child.stdout.readline().strip()
        assert held == f"{HOST}-store-0"
        mine = worker_name("store", None, tmp_path)
        assert mine == f"{HOST}-store-1"  # slot 0 is held by the live child
        release_worker_name(mine)
    finally:
        child.kill()
        child.wait()
    mine = worker_name("store", None, tmp_path)  # killed: the kernel dropped its lock
    release_worker_name(mine)
    assert mine == f"{HOST}-store-0"


def test_without_a_slot_dir_the_pid_keeps_ids_unique() -> None:
    assert worker_name("retry", None) == f"{HOST}-retry-{os.getpid()}"
