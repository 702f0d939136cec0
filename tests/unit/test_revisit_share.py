"""New URLs keep a fair share of a target's starts while revisits are due (issue 45): the
scheduler's revisit and new-URL queues, and their parked queues on disk."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.fetch.parking import ParkedQueues, park_key, queue_of_key
from consumers.fetch.scheduler import BULK, HIGH, QUEUES, REVISIT, TargetScheduler, queue_of
from schemas.topics import partition_for
from tests.unit.conftest import PARKED_PARTS

PARTS = PARKED_PARTS


def _starts(sched: TargetScheduler[str], n: int, interval: float) -> list[tuple[float, str]]:
    """(time, job) of the first ``n`` starts, the clock stepping by ``interval``."""
    out: list[tuple[float, str]] = []
    t = 0.0
    while len(out) < n and len(sched):
        out += [(t, job) for _, job in sched.pop_ready(t, 10)]
        t += interval
    return out


def test_new_urls_start_among_the_first_starts_behind_100_due_revisits() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.5)
    for i in range(100):
        sched.push("t", f"revisit-{i}", 0.0, revisit=True)
    for i in range(10):
        sched.push("t", f"new-{i}", 0.0)
    starts = [job for _, job in _starts(sched, 110, 0.5)]
    assert len(starts) == 110
    new_at = [n for n, job in enumerate(starts) if job.startswith("new")]
    assert max(new_at) < 20, new_at  # not after the 100 revisits
    assert [j for j in starts if j.startswith("new")] == [f"new-{i}" for i in range(10)]
    assert [j for j in starts if j.startswith("revisit")] == \
        [f"revisit-{i}" for i in range(100)]  # each kind in its own order


def test_revisits_keep_half_while_a_site_keeps_minting_new_urls() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 1.0)
    for i in range(10):
        sched.push("t", f"revisit-{i}", 0.0, revisit=True)
    released: list[str] = []
    for k in range(20):  # two new links arrive per start: new URLs alone would never end
        sched.push("t", f"new-{2 * k}", float(k))
        sched.push("t", f"new-{2 * k + 1}", float(k))
        released += [job for _, job in sched.pop_ready(float(k), 10)]
    assert len(released) == 20
    assert sum(j.startswith("revisit") for j in released) == 10


@pytest.mark.parametrize("revisit", [True, False])
def test_one_kind_alone_runs_at_the_full_cap(revisit: bool) -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.5)  # 2 requests/s
    for i in range(40):
        sched.push("t", f"j{i}", 0.0, revisit=revisit)
    starts = _starts(sched, 100, 0.25)
    in_10s = [job for at, job in starts if at < 10.0]
    assert len(in_10s) == 20  # one every 0.5 s, none skipped
    assert [job for _, job in starts] == [f"j{i}" for i in range(40)]


def test_both_kinds_share_one_interval_and_one_in_flight_limit() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 1.0, limit=2)
    for i in range(10):
        sched.push("t", f"revisit-{i}", 0.0, revisit=True)
        sched.push("t", f"new-{i}", 0.0)
    starts = [(t, job) for t in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
              for _, job in sched.pop_ready(t, 10)]
    assert [t for t, _ in starts] == [0.0, 1.0]  # one per interval, then the limit of 2
    sched.done("t", 3.0)
    assert len(sched.pop_ready(3.0, 10)) == 1
    sched.hold("t")  # a paused target sends neither kind
    sched.done("t", 4.0)
    assert sched.pop_ready(10.0, 10) == []


def test_the_high_tier_keeps_its_4_to_1_mix_and_alternates_within() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    for i in range(20):
        sched.push("t", f"hr{i}", 0.0, tier=HIGH, revisit=True)
        sched.push("t", f"hn{i}", 0.0, tier=HIGH)
        sched.push("t", f"bn{i}", 0.0)
    released = [job for k in range(10) for _, job in sched.pop_ready(float(k), 1)]
    assert sum(j.startswith("b") for j in released) == 2  # 4:1 as without revisits
    high = [j for j in released if j.startswith("h")]
    assert sum(j.startswith("hr") for j in high) == sum(j.startswith("hn") for j in high)


def test_a_job_put_back_is_still_next() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    for i in range(3):
        sched.push("t", f"revisit-{i}", 0.0, revisit=True)
        sched.push("t", f"new-{i}", 0.0)
    [(_, first)] = sched.pop_ready(0.0, 1)
    sched.push_front("t", first, 0.0, revisit=first.startswith("revisit"))
    assert sched.pop_ready(1.0, 1) == [("t", first)]


def test_a_revisit_due_after_a_run_of_new_urls_goes_next() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    for i in range(10):
        sched.push("t", f"new-{i}", 0.0)
    assert [j for k in range(5) for _, j in sched.pop_ready(float(k), 1)] == \
        [f"new-{i}" for i in range(5)]
    sched.push("t", "revisit-0", 5.0, revisit=True)
    sched.push("t", "revisit-1", 5.0, revisit=True)
    assert [j for k in range(5, 10) for _, j in sched.pop_ready(float(k), 1)] == \
        ["revisit-0", "new-5", "revisit-1", "new-6", "new-7"]


def test_queues_counted_taken_and_shed_with_their_kind() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    for i in range(3):
        sched.push("t", f"revisit-{i}", 0.0, revisit=True)
        sched.push("t", f"new-{i}", 0.0)
    assert sched.queued("t", BULK | REVISIT) == 3 and sched.queued("t", BULK) == 3
    assert sched.take_tail("t", 4) == ["revisit-1", "revisit-2"]  # revisits go to disk first
    assert sched.queued("t") == 4
    sched.drop(lambda job: job != "revisit-0")
    assert sched.queued("t", BULK | REVISIT) == 0 and len(sched) == 3
    assert sched.take("t") == ["new-0", "new-1", "new-2"]
    assert len(sched) == 0


def test_queue_numbers() -> None:
    assert queue_of(0, False) == BULK and queue_of(3, False) == HIGH
    assert queue_of(0, True) == BULK | REVISIT and queue_of(1, True) == HIGH | REVISIT
    assert sorted(QUEUES) == [0, 1, 2, 3]


# --- on disk --------------------------------------------------------------------------------


@pytest.fixture
def parked(parked_queues: ParkedQueues) -> ParkedQueues:
    return parked_queues


def _job(target: str, i: int, visit: int) -> dict[str, Any]:
    return {"url": f"http://{target}/{i}", "target": target, "profile": "default",
            "attempt": 0, "priority": 0, "meta": {}, "visit": visit}


def test_park_keys_of_each_queue_round_trip_and_old_keys_read_as_new_urls() -> None:
    for queue in QUEUES:
        assert queue_of_key(park_key("a.test", queue, 7)) == ("a.test", queue)
    # keys written before revisits had queues of their own: high \x00, bulk \x01
    assert queue_of_key(b"a.test\x00\x00" + (5).to_bytes(8, "big")) == ("a.test", HIGH)
    assert queue_of_key(b"a.test\x00\x01" + (5).to_bytes(8, "big")) == ("a.test", BULK)


def test_parked_revisits_hold_no_new_url_behind_them(parked: ParkedQueues) -> None:
    part = partition_for("a", PARTS)
    revisits = BULK | REVISIT
    parked.committed([parked.park(part, park_key("a", revisits, o), _job("a", o, 1))
                      for o in range(100)])
    assert parked.must_park("a", revisits)  # a later revisit goes behind them
    assert not parked.must_park("a", BULK)  # a new URL need not
    parked.committed([parked.park(part, park_key("a", BULK, o), _job("a", o, 0))
                      for o in range(100, 110)])
    assert parked.available("a", BULK) == 10 and parked.available("a") == 110
    assert [j["visit"] for _, j in parked.take(part, "a", BULK, 20)] == [0] * 10
    assert {j["visit"] for _, j in parked.take(part, "a", revisits, 5)} == {1}
    fresh = ParkedQueues(parked.store, PARTS)  # restored: each queue counted apart
    assert fresh.restored(part) == ["a"]
    assert fresh.available("a", BULK) == 10 and fresh.available("a", revisits) == 100
