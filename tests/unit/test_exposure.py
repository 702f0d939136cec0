"""The over-apply bound: what each drop of work adds, counted by hand."""

from __future__ import annotations

from typing import Any

from chaos.exposure import REBALANCES_PER_FETCH_KILL, Exposure, repeats_by_fault


def _status(worker: str, *, pid: int = 1, wall: float = 100.0, inflight: int = 0,
            queued: int = 0, uncommitted: int | None = 0, aborted: int = 0) -> dict[str, Any]:
    gauges: dict[str, int] = {"inflight": inflight, "queued": queued}
    if uncommitted is not None:
        gauges["uncommitted"] = uncommitted
    return {"worker": worker, "stage": worker.rsplit("-", 1)[0], "pid": pid, "wall": wall,
            "gauges": gauges, "counters": {"aborted_txns": aborted}}


def _no_requests(a: float, b: float) -> int:
    return 0


def test_a_fetch_kill_adds_its_in_flight_and_uncommitted() -> None:
    e = Exposure(window_s=40.0)
    st = _status("fetch-0", inflight=3, queued=50, uncommitted=7, wall=99.6)
    e.observe([st], 100.0)
    e.on_kill(st, "fetch-0", "fetch", "worker_kill", 100.0)
    b = e.bound(_no_requests)
    assert b.requests == 10  # queued jobs were never requested: not counted
    assert not b.gauge_missing and b.used == 10
    assert b.drops_by_cause == {"worker_kill": 1}


def test_requests_after_the_victims_last_status_are_added() -> None:
    e = Exposure(window_s=40.0)
    st = _status("fetch-0", inflight=2, uncommitted=1, wall=99.5)
    e.on_kill(st, "fetch-0", "fetch", "worker_kill", 100.0)
    asked: list[tuple[float, float]] = []

    def between(a: float, b: float) -> int:
        asked.append((a, b))
        return 4

    assert e.bound(between).requests == 2 + 1 + 4
    assert asked == [(99.5, 100.0)]


def test_the_restarted_victim_is_not_a_second_drop() -> None:
    e = Exposure(window_s=40.0)
    st = _status("fetch-0", pid=10, inflight=2, uncommitted=1)
    e.observe([st], 100.0)
    e.on_kill(st, "fetch-0", "fetch", "worker_kill", 100.5)
    e.observe([_status("fetch-0", pid=11, wall=102.0)], 102.0)  # its replacement
    assert len(e.drops) == 1


def test_an_abort_seen_in_the_counters_adds_the_most_held_since_the_last_drop() -> None:
    e = Exposure(window_s=40.0)
    e.observe([_status("fetch-1", inflight=1, uncommitted=2, wall=100.0)], 100.0)
    e.observe([_status("fetch-1", inflight=4, uncommitted=9, wall=100.5)], 100.5)  # peak 13
    e.observe([_status("fetch-1", inflight=2, uncommitted=5, wall=101.0)], 101.0)
    e.observe([_status("fetch-1", inflight=0, uncommitted=0, wall=101.5, aborted=1)], 101.5)
    b = e.bound(_no_requests)
    assert b.requests == 13
    assert b.drops_by_cause == {"dropped": 1}
    # the next abort counts only what was held after the first
    e.observe([_status("fetch-1", inflight=1, uncommitted=1, wall=102.0, aborted=1)], 102.0)
    e.observe([_status("fetch-1", inflight=0, uncommitted=0, wall=102.5, aborted=2)], 102.5)
    assert e.bound(_no_requests).requests == 13 + 2


def test_a_worker_that_died_on_its_own_is_a_drop() -> None:
    e = Exposure(window_s=40.0)
    e.observe([_status("fetch-0", pid=5, inflight=3, uncommitted=4)], 100.0)
    e.observe([_status("fetch-0", pid=6, wall=103.0)], 103.0)
    assert e.bound(_no_requests).requests == 7
    assert [d.cause for d in e.drops] == ["exited"]


def test_parse_kills_add_nothing_and_store_kills_bound_the_store() -> None:
    e = Exposure(window_s=40.0)
    e.on_kill(_status("parse-0", inflight=9, uncommitted=9), "parse-0", "parse",
              "worker_kill", 100.0)
    e.on_kill(_status("store-0", uncommitted=25), "store-0", "store", "store_restart", 101.0)
    b = e.bound(_no_requests)
    assert b.requests == 0 and b.store_rows == 25
    assert b.drops_by_cause == {"worker_kill": 1, "store_restart": 1}
    assert not b.gauge_missing and not b.store_gauge_missing


def test_a_store_without_the_gauge_leaves_the_request_bound_alone() -> None:
    e = Exposure(window_s=40.0)
    e.on_kill(_status("fetch-0", inflight=1, uncommitted=3), "fetch-0", "fetch",
              "worker_kill", 100.0)
    e.on_kill(_status("store-0", uncommitted=None), "store-0", "store", "worker_kill", 101.0)
    b = e.bound(_no_requests)
    assert not b.gauge_missing and b.store_gauge_missing
    assert b.used == b.requests == 4  # judged by the gauge, not the legacy estimate


def test_without_the_gauge_the_legacy_estimate_is_the_bound() -> None:
    e = Exposure(window_s=40.0)
    fleet = [_status("fetch-0", inflight=2, queued=10, uncommitted=None),
             _status("fetch-1", inflight=3, queued=5, uncommitted=None)]
    e.observe(fleet, 100.0)
    e.on_kill(fleet[0], "fetch-0", "fetch", "worker_kill", 100.0)  # window: fleet load 20
    e.observe([fleet[0], _status("fetch-1", inflight=8, queued=20, uncommitted=None,
                                 wall=110.0)],
              110.0)  # fetch-1 now holds 28, fetch-0's file still says 12: 40 in the window
    b = e.bound(_no_requests)
    assert b.gauge_missing
    assert b.requests == 2  # in flight only: the gauge counted as 0
    assert b.legacy == 12 + REBALANCES_PER_FETCH_KILL * 40
    assert b.used == b.legacy


def test_a_broker_fault_widens_the_legacy_window_while_it_lasts() -> None:
    e = Exposure(window_s=10.0)
    e.observe([_status("fetch-0", inflight=1, queued=1, uncommitted=None)], 100.0)
    key = e.open_window(100.0)
    e.extend(key, 130.0)  # the fault lasted until 130: its window ends at 140
    e.observe([_status("fetch-0", inflight=5, queued=5, uncommitted=None, wall=138.0)], 138.0)
    e.observe([_status("fetch-0", inflight=50, queued=50, uncommitted=None, wall=141.0)],
              141.0)  # after the window: not counted
    assert e.bound(_no_requests).legacy == REBALANCES_PER_FETCH_KILL * 10


def test_repeated_requests_are_put_down_to_the_latest_fault_before_them() -> None:
    requests = [(1.0, "a"), (2.0, "b"), (3.0, "a"),  # a repeated before any fault
                (11.0, "a"), (12.0, "c"), (13.0, "b"),  # after the kill at 10
                (25.0, "c"), (26.0, "d")]  # after the broker fault at 20
    faults = [(20.0, "broker_kill broker 2"), (10.0, "worker_kill fetch-0")]
    assert repeats_by_fault(requests, faults) == {
        "before any fault": 1, "worker_kill fetch-0": 2, "broker_kill broker 2": 1}
    assert repeats_by_fault(requests, []) == {"before any fault": 4}
