"""A round that does not drain names the workers to look at, and shows what they said."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaos.drain import SILENT_S, silent_workers, stuck_workers, unsettled_gauges
from chaos.evidence import log_tail, stack_dump, stuck_notes
from crawlfleet.crawl import IDLE_S

NOW = 1_000_000.0


def status(worker: str, stage: str, written_ago: float, **gauges: int) -> dict[str, Any]:
    return {"worker": worker, "stage": stage, "wall": NOW - written_ago,
            "idle_s": IDLE_S + 1, "gauges": gauges}


def test_a_worker_whose_status_stopped_being_written_is_named_silent() -> None:
    # Its last gauges said idle and empty: only the file's age shows its loop is stuck.
    statuses = [status("store-0", "store", SILENT_S + 5), status("parse-0", "parse", 0.2)]
    why = unsettled_gauges(statuses, {"store": 12, "parse": 0}, workers=2, now=NOW)
    assert "store lag 12" in why
    assert "store-0 silent 20s" in why
    assert "parse-0" not in why


def test_a_calm_fleet_reads_calm() -> None:
    statuses = [status("store-0", "store", 0.3), status("fetch-0", "fetch", 1.0)]
    assert unsettled_gauges(statuses, {"store": 0, "fetch": 0}, workers=2, now=NOW) == ""


def test_the_stuck_are_the_lagging_stages_workers_and_the_silent() -> None:
    statuses = [status("store-0", "store", 0.1), status("fetch-1", "fetch", SILENT_S),
                status("fetch-0", "fetch", 0.1), status("parse-0", "parse", 0.1)]
    silent = silent_workers(statuses, now=NOW)
    assert silent == {"fetch-1"}
    assert stuck_workers(statuses, {"store": 3, "parse": 0, "fetch": 0}, silent) == [
        "fetch-1", "store-0"]


def test_a_log_tail_keeps_the_workers_own_lines(tmp_path: Path) -> None:
    log = tmp_path / "store-0.log"
    lines = [f"line {i}" for i in range(40)]
    noise = "%3|1796310079.582|FAIL|rdkafka#consumer-1| Connect failed"
    log.write_text("\n".join(x for ln in lines for x in (ln, noise)) + "\n")
    assert log_tail(log, 5) == lines[-5:]
    assert log_tail(tmp_path / "none.log")[0].startswith("(no log:")


def test_a_silent_workers_note_shows_where_its_threads_stand(tmp_path: Path) -> None:
    # A real process stuck in a call: the dump names the function it is stuck in.
    code = "import time\ndef stuck_in_a_call():\n    time.sleep(60)\nstuck_in_a_call()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        assert any("stuck_in_a_call" in ln for ln in stack_dump(proc.pid)), stack_dump(proc.pid)
        (tmp_path / "store-0.log").write_text("store store-0: assigned 12\n")
        (note,) = stuck_notes(["store-0"], {"store-0"}, tmp_path, {"store-0": proc.pid})
        assert "assigned 12" in note and "stuck_in_a_call" in note
        (quiet,) = stuck_notes(["store-0"], set(), tmp_path, {"store-0": proc.pid})
        assert "py-spy" not in quiet  # a lagging worker that still turns: its log only
    finally:
        proc.kill()
        proc.wait()


def test_only_the_store_behind_reads_as_the_tail_never_as_calm() -> None:
    """The crawl looks quickly while only the store's last batches are left (``tail``), and
    never calls that calm: the store's lag, and a worker holding work, both count."""
    from types import SimpleNamespace

    from crawlfleet.crawl import _calm
    from crawlfleet.fleet import Plan
    from schemas.stages import stages, stages_where
    STORE_STAGES = stages_where("store_owner")
    fleet: Any = SimpleNamespace(plan=Plan())
    statuses = [status(f"{s}-0", s, 0.1) for s in stages()]
    calm_lags = dict.fromkeys(stages(), 0)
    store_behind = {**calm_lags, "store": 670}
    assert _calm(statuses, calm_lags, fleet)
    assert not _calm(statuses, store_behind, fleet)
    assert _calm(statuses, store_behind, fleet, but=STORE_STAGES)
    # Upstream still behind, or holding work, or a worker missing: not the tail.
    assert not _calm(statuses, {**store_behind, "parse": 3}, fleet, but=STORE_STAGES)
    holding = [status("fetch-0", "fetch", 0.1, parked=4) if s["stage"] == "fetch" else s
               for s in statuses]
    assert not _calm(holding, store_behind, fleet, but=STORE_STAGES)
    without_parse = [s for s in statuses if s["stage"] != "parse"]
    assert not _calm(without_parse, store_behind, fleet, but=STORE_STAGES)
    # The store's own status is not needed for the tail.
    without_store = [s for s in statuses if s["stage"] != "store"]
    assert _calm(without_store, store_behind, fleet, but=STORE_STAGES)
