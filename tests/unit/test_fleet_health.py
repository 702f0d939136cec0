"""Stalls, held work and the doctor's worker checks, from status files (pure parts)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

from crawlfleet.doctor import FAIL, OK, WARN, worker_checks
from crawlfleet.health import HeldWork, StallWatch, stalls, worker_state
from infra.live_state import LiveEntries

HOST = socket.gethostname()
LAGS = {"fetch": 0, "parse": 5, "store": 7, "retry": 0}


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def status(stage: str, worker: str, pid: int | None = None, waiting: str = "",
           host: str = HOST, **gauges: int) -> dict[str, Any]:
    return {"stage": stage, "worker": worker, "pid": pid or os.getpid(), "host": host,
            "waiting": waiting, "gauges": gauges, "counters": {}, "idle_s": 5.0}


def test_a_stage_with_lag_and_no_serving_worker_is_stalled_with_why() -> None:
    gone = dead_pid()
    statuses = [status("parse", "parse-0", pid=gone),
                status("store", "store-0", waiting="store: held by reader pid 42",
                       store_waiting=1),
                status("fetch", "fetch-0")]
    found = stalls(LAGS, statuses)
    assert found == {
        "parse": f"stalled: no parse worker (parse-0 dead: pid {gone} is gone)",
        "store": "stalled: no store worker (store-0 waiting: store: held by reader pid 42)"}
    # No lag: nothing to do, nothing stalled, whatever the workers are up to.
    assert stalls({**LAGS, "parse": 0, "store": 0}, statuses) == {}
    # One serving worker is enough; no status at all is a stall too.
    assert "parse" not in stalls(LAGS, [*statuses, status("parse", "parse-1")])
    assert stalls(LAGS, []) == {"parse": "stalled: no parse worker",
                                "store": "stalled: no store worker"}


def test_kafka_members_count_unless_this_host_knows_them_dead() -> None:
    gone = dead_pid()
    members = {"parse": ["parse-0"], "store": ["store-9"]}
    statuses = [status("parse", "parse-0", pid=gone)]
    found = stalls(LAGS, statuses, members)
    assert "parse" in found  # a killed static member lingers in its group: not serving
    assert "store" not in found  # a member on another host: serving as far as we know
    elsewhere = [status("parse", "parse-0", pid=gone, host="elsewhere")]
    assert worker_state(elsewhere[0]).state == "serving"
    assert "parse" not in stalls(LAGS, elsewhere, members)


def test_a_stall_is_shown_once_it_lasted_the_grace() -> None:
    watch = StallWatch(grace_s=2.0)
    seen = {"store": "stalled: no store worker"}
    assert watch.update(seen, 10.0) == {}
    assert watch.update(seen, 11.9) == {}
    assert watch.update(seen, 12.0) == seen
    assert watch.update({}, 12.5) == {}
    assert watch.update(seen, 13.0) == {}  # a new stall starts its own grace


def live(topic: str, counts: dict[int, int], unsettled: set[int] | None = None) -> LiveEntries:
    return LiveEntries(topic, counts=counts, unsettled=unsettled or set())


def test_held_work_is_empty_only_when_both_changelogs_are_empty_and_settled() -> None:
    empty = live("p", {0: 0, 1: 0})
    assert HeldWork(empty, empty).empty
    parked = HeldWork(live("p", {0: 0, 1: 77}), empty)
    assert not parked.empty
    assert parked.describe() == "crawl.parked 77 live (p1 77), crawl.timers 0 live"
    open_txn = HeldWork(empty, live("t", {0: 0, 1: 0}, {1}))
    assert not open_txn.empty
    assert "crawl.timers 0 live + open transaction on p1" in open_txn.describe()


def test_doctor_names_waiting_and_dead_workers_with_their_fix() -> None:
    gone = dead_pid()
    results = worker_checks([
        status("store", "store-0", waiting="store: open in reader pid 42 (crawlfleet sql)",
               store_waiting=1, store_waiting_s=45),
        status("parse", "parse-0", waiting="Kafka at 127.0.0.1:9092: refused",
               kafka_waiting=1, kafka_waiting_s=3),
        status("fetch", "fetch-0", pid=gone)])
    by_name = {c.name: c for c in results}
    store = by_name["store worker store-0 has its store"]
    assert store.verdict == FAIL and "reader pid 42" in store.value and "45 s" in store.value
    assert "reader" in store.fix
    kafka = by_name["parse worker parse-0 reaches Kafka"]
    assert kafka.verdict == WARN and "crawlfleet kafka up" in kafka.fix
    dead = by_name["fetch worker fetch-0 runs"]
    assert dead.verdict == WARN and "--worker-id fetch-0" in dead.fix
    (healthy,) = worker_checks([status("fetch", "fetch-0")])
    assert healthy.verdict == OK
