"""Per-target politeness scheduling, driven by a fake monotonic clock (plain numbers)."""

from __future__ import annotations

import random
from collections import defaultdict
from itertools import pairwise

import pytest

from consumers.fetch.scheduler import HIGH, TargetScheduler

EPS = 1e-9


def sched(interval: float = 1.0, **per_target: float) -> TargetScheduler[str]:
    return TargetScheduler(lambda t: per_target.get(t.replace(".", "_"), interval))


def test_empty() -> None:
    s = sched()
    assert len(s) == 0
    assert s.next_due() is None
    assert s.pop_ready(100.0, 10) == []


def test_one_job_per_target_per_interval() -> None:
    s = sched(2.0)
    for i in range(3):
        s.push("a", f"a{i}", now=0.0)
    assert len(s) == 3
    assert s.pop_ready(0.0, 10) == [("a", "a0")]  # only one even though three are queued
    assert s.pop_ready(0.0, 10) == []
    assert s.pop_ready(1.999, 10) == []
    assert s.pop_ready(2.0, 10) == [("a", "a1")]
    assert s.pop_ready(3.0, 10) == []
    assert s.pop_ready(4.5, 10) == [("a", "a2")]
    assert len(s) == 0
    assert s.queued("a") == 0


def test_fifo_within_a_target() -> None:
    s = sched(1.0)
    for i in range(5):
        s.push("a", f"a{i}", now=0.0)
    got = [job for t in range(5) for _, job in s.pop_ready(float(t), 10)]
    assert got == ["a0", "a1", "a2", "a3", "a4"]


def test_late_poll_does_not_allow_a_burst() -> None:
    s = sched(1.0)
    for i in range(3):
        s.push("a", f"a{i}", now=0.0)
    assert s.pop_ready(10.0, 10) == [("a", "a0")]  # idle time is not banked as credit
    assert s.pop_ready(10.5, 10) == []
    assert s.pop_ready(11.0, 10) == [("a", "a1")]


def test_a_request_that_left_late_pushes_the_next_one_back() -> None:
    """Releases are an interval apart; sends are too, even when one left late (the worker's
    event loop was busy): the site sees the gap between the requests, not the releases."""
    s = sched(0.5)
    for i in range(3):
        s.push("a", f"a{i}", now=0.0)
    assert s.pop_ready(0.0, 10) == [("a", "a0")]
    s.sent("a", 0.45)  # a0 left 0.45 s after its release
    assert s.pop_ready(0.5, 10) == [("a", "a1")]
    assert abs(s.reserve_send("a", 0.5) - 0.95) < EPS  # a1 waits until 0.95
    assert s.pop_ready(1.0, 10) == [("a", "a2")]
    s.sent("a", 0.9)  # an older time never moves the last send back
    assert abs(s.reserve_send("a", 1.0) - 1.45) < EPS  # an interval after a1's 0.95
    assert s.reserve_send("b", 1.0) == 1.0  # a target without a slot: nothing to wait for


def test_targets_interleave_independently() -> None:
    s = sched(1.0, slow_com=5.0)
    for i in range(3):
        s.push("fast.com", f"f{i}", now=0.0)
        s.push("slow.com", f"s{i}", now=0.0)
    assert sorted(s.pop_ready(0.0, 10)) == [("fast.com", "f0"), ("slow.com", "s0")]
    assert s.pop_ready(1.0, 10) == [("fast.com", "f1")]
    assert s.pop_ready(2.0, 10) == [("fast.com", "f2")]
    assert s.pop_ready(4.9, 10) == []
    assert s.pop_ready(5.0, 10) == [("slow.com", "s1")]
    assert s.pop_ready(10.0, 10) == [("slow.com", "s2")]


def test_new_job_after_idle_goes_immediately_but_respects_last_release() -> None:
    s = sched(3.0)
    s.push("a", "a0", now=0.0)
    assert s.pop_ready(0.0, 10) == [("a", "a0")]
    s.push("a", "a1", now=1.0)  # queue was empty, but the last request was at 0
    assert s.pop_ready(1.0, 10) == []
    assert s.next_due() == 3.0
    assert s.pop_ready(3.0, 10) == [("a", "a1")]
    s.push("a", "a2", now=50.0)
    assert s.pop_ready(50.0, 10) == [("a", "a2")]


def test_limit() -> None:
    s = sched(1.0)
    for t in range(5):
        s.push(f"t{t}", f"job{t}", now=0.0)
    first = s.pop_ready(0.0, 2)
    assert len(first) == 2
    rest = s.pop_ready(0.0, 10)
    assert len(rest) == 3
    assert {t for t, _ in first} | {t for t, _ in rest} == {f"t{t}" for t in range(5)}
    assert s.pop_ready(0.0, 0) == []
    assert len(s) == 0


def test_limit_zero_releases_nothing() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    assert s.pop_ready(5.0, 0) == []
    assert s.pop_ready(5.0, 1) == [("a", "a0")]


def test_defer_pushes_a_target_later() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    s.defer("a", until=30.0)
    assert s.pop_ready(0.0, 10) == []
    assert s.pop_ready(29.9, 10) == []
    assert s.pop_ready(30.0, 10) == [("a", "a0")]


def test_defer_never_earlier() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    s.defer("a", until=30.0)
    s.defer("a", until=10.0)  # an earlier deadline must not shorten the rest
    assert s.pop_ready(10.0, 10) == []
    assert s.pop_ready(30.0, 10) == [("a", "a0")]


def test_defer_does_not_shorten_the_interval() -> None:
    s = sched(5.0)
    s.push("a", "a0", now=0.0)
    s.push("a", "a1", now=0.0)
    assert s.pop_ready(0.0, 10) == [("a", "a0")]
    s.defer("a", until=2.0)  # earlier than the interval allows: ignored
    assert s.pop_ready(2.0, 10) == []
    assert s.pop_ready(5.0, 10) == [("a", "a1")]


def test_defer_does_not_delay_other_targets() -> None:
    s = sched(1.0)
    for i in range(3):
        s.push("a", f"a{i}", now=0.0)
        s.push("b", f"b{i}", now=0.0)
    s.defer("a", until=100.0)
    assert s.pop_ready(0.0, 10) == [("b", "b0")]
    assert s.pop_ready(1.0, 10) == [("b", "b1")]
    assert s.pop_ready(2.0, 10) == [("b", "b2")]
    assert s.pop_ready(99.0, 10) == []
    assert s.pop_ready(100.0, 10) == [("a", "a0")]
    assert s.pop_ready(101.0, 10) == [("a", "a1")]


def test_defer_of_an_unknown_target_applies_to_later_pushes() -> None:
    s = sched(1.0)
    s.defer("a", until=20.0)
    assert len(s) == 0
    s.push("a", "a0", now=5.0)
    assert s.pop_ready(5.0, 10) == []
    assert s.pop_ready(20.0, 10) == [("a", "a0")]


def test_defer_of_an_idle_target() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    assert s.pop_ready(0.0, 10) == [("a", "a0")]
    s.defer("a", until=60.0)  # e.g. the answer to a0 was a 429 with Retry-After: 60
    s.push("a", "a1", now=2.0)
    assert s.pop_ready(59.0, 10) == []
    assert s.pop_ready(60.0, 10) == [("a", "a1")]


def test_push_front() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    s.push("a", "a1", now=0.0)
    [(_, job)] = s.pop_ready(0.0, 10)
    assert job == "a0"
    s.push_front("a", "a0", now=0.5)  # released too early (e.g. robots not loaded yet)
    assert s.queued("a") == 2
    assert len(s) == 2
    assert s.pop_ready(1.0, 10) == [("a", "a0")]
    assert s.pop_ready(2.0, 10) == [("a", "a1")]


def test_push_front_into_empty_target() -> None:
    s = sched(1.0)
    s.push_front("a", "x", now=0.0)
    assert s.pop_ready(0.0, 10) == [("a", "x")]


def test_drop() -> None:
    s = sched(1.0)
    for i in range(4):
        s.push("a", f"a{i}", now=0.0)
        s.push("b", f"b{i}", now=0.0)
    dropped = s.drop(lambda job: not job.startswith("a") and job != "b2")
    assert dropped == 5
    assert len(s) == 3
    assert s.queued("a") == 0
    assert s.queued("b") == 3
    released = [job for t in range(10) for _, job in s.pop_ready(float(t), 10)]
    assert released == ["b0", "b1", "b3"]
    assert len(s) == 0


def test_drop_nothing() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    assert s.drop(lambda job: True) == 0
    assert len(s) == 1


def test_target_can_be_refilled_after_drop() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    s.drop(lambda job: False)
    assert s.pop_ready(0.0, 10) == []
    s.push("a", "a1", now=1.0)
    assert s.pop_ready(1.0, 10) == [("a", "a1")]


def test_next_due() -> None:
    s = sched(4.0)
    s.push("a", "a0", now=10.0)
    assert s.next_due() == 10.0
    s.push("a", "a1", now=11.0)
    s.push("b", "b0", now=12.0)
    assert s.next_due() == 10.0
    s.pop_ready(12.0, 10)  # a0 and b0
    assert s.next_due() == 16.0  # a1: 12 + 4
    s.pop_ready(16.0, 10)
    assert s.next_due() is None


def test_next_due_after_defer_is_not_before_release_once_polled() -> None:
    s = sched(1.0)
    s.push("a", "a0", now=0.0)
    s.defer("a", until=50.0)
    due = s.next_due()
    assert due is not None and due <= 50.0  # may wake the caller early, never late
    if due < 50.0:
        assert s.pop_ready(due, 10) == []  # the early wake-up releases nothing...
    assert s.next_due() == 50.0  # ...and leaves the real due time on top
    assert s.pop_ready(50.0, 10) == [("a", "a0")]


def test_set_interval() -> None:
    s = sched(1.0)
    for i in range(3):
        s.push("a", f"a{i}", now=0.0)
    s.set_interval("a", 10.0)  # e.g. Crawl-delay learned from robots.txt
    assert s.pop_ready(0.0, 10) == [("a", "a0")]
    assert s.pop_ready(5.0, 10) == []
    assert s.pop_ready(10.0, 10) == [("a", "a1")]
    s.set_interval("unknown", 3.0)  # no effect, no error


def test_interval_is_asked_once_per_target() -> None:
    calls: list[str] = []

    def interval_for(target: str) -> float:
        calls.append(target)
        return 1.0

    s: TargetScheduler[int] = TargetScheduler(interval_for)
    for i in range(5):
        s.push("a", i, now=float(i))
        s.pop_ready(float(i), 10)
    assert calls == ["a"]


@pytest.mark.parametrize("seed", range(20))
def test_property_releases_never_closer_than_interval(seed: int) -> None:
    rng = random.Random(seed)
    targets = [f"t{i}.example" for i in range(rng.randint(1, 40))]
    intervals = {t: rng.choice([0.0, 0.1, 0.5, 1.0, 2.5, 7.0]) for t in targets}
    s: TargetScheduler[tuple[str, int]] = TargetScheduler(lambda t: intervals[t])
    pushed: dict[str, list[int]] = defaultdict(list)
    released: dict[str, list[tuple[float, int]]] = defaultdict(list)
    deferred_until: dict[str, float] = defaultdict(float)
    counter = 0
    now = 0.0
    for _ in range(600):
        now += rng.choice([0.0, 0.01, 0.05, 0.3, 1.0, 3.0])
        action = rng.random()
        if action < 0.5:
            for _ in range(rng.randint(1, 4)):
                t = rng.choice(targets)
                s.push(t, (t, counter), now)
                pushed[t].append(counter)
                counter += 1
        elif action < 0.55:
            t = rng.choice(targets)
            until = now + rng.uniform(0, 20)
            s.defer(t, until)
            deferred_until[t] = max(deferred_until[t], until)
        for t, (jt, n) in s.pop_ready(now, rng.randint(1, 8)):
            assert t == jt
            assert now + EPS >= deferred_until[t], "released before its deferral ended"
            released[t].append((now, n))
    # drain
    while len(s):
        due = s.next_due()
        assert due is not None
        now = max(now, due)
        for t, (_, n) in s.pop_ready(now, 1000):
            assert now + EPS >= deferred_until[t]
            released[t].append((now, n))

    for t, rel in released.items():
        times = [at for at, _ in rel]
        for a, b in pairwise(times):
            assert b - a >= intervals[t] - EPS, (t, a, b, intervals[t])
        assert [n for _, n in rel] == pushed[t], "every job released once, in FIFO order"
    assert set(released) == {t for t in pushed if pushed[t]}


def test_bulk_tier_keeps_its_reserved_share_under_a_busy_high_tier() -> None:

    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    for i in range(100):
        sched.push("t", f"high-{i}", 0.0, tier=HIGH)
        sched.push("t", f"bulk-{i}", 0.0)
    released = [job for _ in range(50) for _, job in sched.pop_ready(float(_), 1)]
    bulk = sum(1 for j in released if j.startswith("bulk"))
    assert bulk == 10  # 4:1, i.e. the bulk tier keeps 20% while the high tier is busy
    assert released[:4] == ["high-0", "high-1", "high-2", "high-3"]
    assert released[4] == "bulk-0"


def test_high_tier_alone_uses_all_the_capacity() -> None:

    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    for i in range(10):
        sched.push("t", f"high-{i}", 0.0, tier=HIGH)
    assert [j for k in range(10) for _, j in sched.pop_ready(float(k), 1)] == \
        [f"high-{i}" for i in range(10)]


def test_refund_gives_the_slot_back() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 1.0)
    for job in ("a", "b", "c"):
        sched.push("t", job, 0.0)
    assert sched.pop_ready(0.0, 5) == [("t", "a")]
    assert sched.pop_ready(0.5, 5) == []
    sched.refund("t", 0.5)  # "a" sent no request: "b" may go now, not at 1.0
    assert sched.pop_ready(0.5, 5) == [("t", "b")]
    assert sched.pop_ready(1.0, 5) == []  # and the spacing after it is intact
    assert sched.pop_ready(1.5, 5) == [("t", "c")]


def test_inflight_limit_bounds_a_slow_target_not_the_others() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0, limit=2)
    for i in range(10):
        sched.push("slow", f"s{i}", 0.0)
        sched.push("fast", f"f{i}", 0.0)
    released = [sched.pop_ready(float(k), 10) for k in range(5)]
    slow = [j for batch in released for t, j in batch if t == "slow"]
    assert slow == ["s0", "s1"]  # nothing came back: two connections, no more
    sched.done("fast", 5.0)  # a fast answer frees only the fast target's slot
    assert [t for t, _ in sched.pop_ready(6.0, 10)] == ["fast"]
    sched.done("slow", 6.0)
    assert sched.pop_ready(7.0, 10) == [("slow", "s2")]
    assert sched.inflight("slow") == 2


def test_set_limit_applies_to_queued_work() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 1.0)
    sched.set_limit("t", 1, 0.0)
    for i in range(3):
        sched.push("t", f"j{i}", 0.0)
    assert sched.pop_ready(0.0, 10) == [("t", "j0")]
    assert sched.pop_ready(1.0, 10) == []
    sched.set_limit("t", 3, 1.0)  # regained: the queue flows again, one per interval
    assert sched.pop_ready(1.0, 10) == [("t", "j1")]
    assert sched.pop_ready(2.0, 10) == [("t", "j2")]


def test_done_is_ignored_for_unknown_or_idle_targets() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    sched.done("nobody", 0.0)
    sched.push("t", "a", 0.0)
    sched.done("t", 0.0)  # nothing in flight: no negative count
    assert sched.inflight("t") == 0
    assert sched.pop_ready(0.0, 5) == [("t", "a")]


def test_take_tail_keeps_the_oldest_and_returns_the_newest_in_order() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda _t: 0.0)
    for i in range(5):
        sched.push("t", f"b{i}", 0.0)
    sched.push("t", "h0", 0.0, tier=HIGH)
    assert sched.take_tail("t", 3) == ["b2", "b3", "b4"]  # bulk tail first
    assert len(sched) == 3 and sched.queued("t") == 3
    assert sched.take_tail("t", 0) == ["h0", "b0", "b1"]
    assert len(sched) == 0
    assert sched.take_tail("nobody", 0) == []


def test_a_target_taken_over_sends_an_interval_after_the_takeover() -> None:
    # A rolling restart's fetch worker came back within a second with the same partitions
    # and sent at once: the site saw 4 requests in 1 s at cap 2 (its former life had sent 2).
    taken = {"a.test": 10.0}
    s: TargetScheduler[str] = TargetScheduler(
        lambda t: 0.5, taken_over_at=lambda t: taken.get(t, float("-inf")))
    s.push("a.test", "a1", now=10.0)
    s.push("b.test", "b1", now=10.0)
    assert sorted(s.pop_ready(10.0, 10)) == [("a.test", "a1"), ("b.test", "b1")]
    assert s.reserve_send("a.test", 10.0) == pytest.approx(10.5)  # taken over at 10.0
    assert s.reserve_send("b.test", 10.0) == 10.0  # a new crawl's target: at once
    # A slot this worker already had, taken over again (a restore after a rebalance).
    s.handover(lambda t: t == "b.test", 12.0)
    assert s.reserve_send("b.test", 12.0) == pytest.approx(12.5)
    assert s.reserve_send("a.test", 12.0) == 12.0


def test_two_requests_waiting_for_their_time_leave_an_interval_apart() -> None:
    s: TargetScheduler[str] = TargetScheduler(
        lambda t: 0.5, taken_over_at=lambda t: 10.0)  # taken over at 10.0
    s.push("a.test", "a1", now=10.0)
    first = s.reserve_send("a.test", 10.1)  # released, waits out the takeover's interval
    second = s.reserve_send("a.test", 10.2)  # released before the first one left
    assert first == pytest.approx(10.5)
    assert second == pytest.approx(11.0)
