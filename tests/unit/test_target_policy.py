"""The fetch worker's per-target policy without a broker: memory share, the park decision,
adaptive back-off and recovery, Crawl-delay, rests, crawl windows, and forgetting within
``max_target_state`` (a degraded target's health kept aside, so no cap loosens). A real
scheduler and robots.txt cache, a fake monotonic clock (plain numbers). Every expected
value is worked out by hand from the defaults: cap 2/s (interval 0.5 s), 5 s of work plus
a floor of 8 plus the in-flight limit (8) per share."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from consumers.fetch.classify import Signal
from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import BULK, REVISIT, TargetScheduler
from consumers.fetch.target_policy import TargetPolicy
from core.config import Settings

EPS = 1e-9


class _World:
    """A policy wired as the fetch session wires it, with its counters kept."""

    def __init__(self, **overrides: Any) -> None:
        self.s = Settings(**{"rate_cap": 2.0, **overrides})
        self.counters: Counter[str] = Counter()
        self.sched: TargetScheduler[str] = TargetScheduler(
            lambda t: self.policy.base_interval(t), limit=self.s.max_inflight_per_target)
        self.robots = RobotsCache("crawlfleet", 3600.0,
                                  lambda t, i: self.policy.on_robots(t, i),
                                  max_origins=self.s.max_target_state)
        self.policy = TargetPolicy(self.s, self.sched, self.robots, self.s.cap_for,
                                   lambda name, n: self.counters.update({name: n}))

    def run_one(self, target: str, now: float) -> None:
        """One job of ``target`` released and finished at ``now``."""
        self.sched.push(target, f"{target}/job", now)
        ((t, _),) = self.sched.pop_ready(now, 1)
        assert t == target
        self.sched.done(target, now)

    def release_times(self, target: str, jobs: int, until: float) -> list[float]:
        """When the scheduler releases ``jobs`` queued jobs of ``target`` (10 ms steps)."""
        for n in range(jobs):
            self.sched.push(target, f"{target}/{n}", 0.0)
        out = []
        for step in range(int(until * 100) + 1):
            now = step / 100
            for t, _ in self.sched.pop_ready(now, 10):
                out.append(now)
                self.sched.done(t, now)
        return out


# --- memory share and the park decision ----------------------------------------------------


def test_share_is_a_few_seconds_of_work_plus_floor_and_inflight_within_the_ceiling() -> None:
    w = _World(rate_caps={"slow.test": 0.1, "fast.test": 1000.0})
    assert w.policy.share("a.test") == 8 + 8 + 10  # 2/s for 5 s
    assert w.policy.share("slow.test") == 8 + 8 + 1  # 0.5 job, rounded up
    assert w.policy.share("fast.test") == 2500  # half of max_buffered (5000)
    small = _World(max_buffered=40)
    assert small.policy.share("a.test") == 20  # half of max_buffered, whatever the rate


def test_a_job_parks_behind_parked_work_beyond_its_share_or_with_no_room() -> None:
    w = _World(max_target_state=2)
    assert not w.policy.must_park("a.test", 0, 0.0, behind_parked=False)
    assert w.policy.must_park("a.test", 0, 0.0, behind_parked=True)  # order kept
    for n in range(26):  # a.test's share (26) in its bulk tier
        w.sched.push("a.test", f"a{n}", 0.0)
    assert w.policy.must_park("a.test", 0, 0.0, behind_parked=False)
    assert not w.policy.must_park("a.test", 1, 0.0, behind_parked=False)  # own share
    w.sched.push("b.test", "b0", 0.0)  # both target states in use, neither idle
    assert w.policy.must_park("c.test", 0, 0.0, behind_parked=False)
    assert "c.test" not in w.sched


def test_due_revisits_filling_their_share_leave_room_for_new_urls() -> None:
    w = _World()
    for n in range(26):  # a.test's share (26) of due revisits in memory
        w.sched.push("a.test", f"r{n}", 0.0, revisit=True)
    assert w.policy.must_park("a.test", BULK | REVISIT, 0.0, behind_parked=False)
    assert not w.policy.must_park("a.test", BULK, 0.0, behind_parked=False)  # own share


def test_a_new_target_finds_room_by_forgetting_the_longest_idle() -> None:
    w = _World(max_target_state=2)
    w.run_one("old.test", 0.0)
    w.run_one("new.test", 1.0)
    assert w.policy.room_for("c.test", 2.0)  # both idle past their interval (0.5 s)
    assert "old.test" not in w.sched and "new.test" in w.sched
    assert w.counters["targets_forgotten"] == 1


def test_no_room_is_looked_for_again_only_after_the_retry_time() -> None:
    w = _World(max_target_state=2)
    w.sched.push("a.test", "a", 0.0)
    w.sched.push("b.test", "b", 0.0)
    assert not w.policy.room_for("c.test", 0.0)
    w.sched.take("a.test")  # idle now (b.test in flight), but the scan waits for
    assert [t for t, _ in w.sched.pop_ready(0.5, 10)] == ["b.test"]  # ROOM_RETRY_S (1 s)
    assert not w.policy.room_for("c.test", 0.5)
    assert w.policy.room_for("c.test", 1.0)


# --- rate: cap, Crawl-delay, adaptive health -----------------------------------------------


def test_crawl_delay_slows_a_target_below_its_cap_and_never_speeds_it_up() -> None:
    w = _World(rate_caps={"capped.test": 0.1})
    w.robots.on_rules("a.test", 3.0)
    assert w.policy.interval("a.test") == pytest.approx(3.0)
    w.robots.on_rules("a.test", 1.0)  # a later, smaller delay does not loosen it
    assert w.policy.interval("a.test") == pytest.approx(3.0)
    w.robots.on_rules("capped.test", 3.0)  # the cap (10 s) is stricter
    assert w.policy.interval("capped.test") == pytest.approx(10.0)
    assert w.policy.interval("other.test") == pytest.approx(0.5)


def test_a_known_crawl_delay_paces_the_scheduler() -> None:
    w = _World()
    w.sched.push("a.test", "first", 0.0)
    w.robots.on_rules("a.test", 3.0)
    w.sched.take("a.test")
    assert w.release_times("a.test", 3, until=7.0) == [0.0, 3.0, 6.0]


def test_an_error_slows_a_target_and_shrinks_its_share() -> None:
    w = _World()
    w.sched.push("a.test", "job", 0.0)
    seen = w.policy.observe("a.test", Signal.ERROR, None, 0.0)
    assert seen.wait == 0.0  # an isolated error slows, never halts
    assert w.policy.interval("a.test") == pytest.approx(1.0)  # half rate
    assert w.policy.share("a.test") == 8 + 4 + 5  # in-flight limit halved, 1/s for 5 s


def test_repeated_errors_escalate_to_a_rest_and_retry_after_is_obeyed() -> None:
    w = _World()
    waits = [w.policy.observe("a.test", Signal.ERROR, None, 0.0).wait for _ in range(4)]
    assert waits == [0.0, 0.0, 2.0, 4.0]
    assert w.policy.observe("b.test", Signal.THROTTLED, None, 0.0).wait == 2.0
    assert w.policy.observe("c.test", Signal.THROTTLED, 30.0, 0.0).wait == 30.0


def test_a_slowed_target_with_much_queued_keeps_only_its_new_share() -> None:
    w = _World()
    for n in range(30):
        w.sched.push("a.test", f"a{n}", 0.0)
    for n in range(60):
        w.sched.push("b.test", f"b{n}", 0.0)
    # one error: share 8 + 4 + 5 = 17; 30 queued is within twice that, 60 is not
    assert w.policy.observe("a.test", Signal.ERROR, None, 0.0).shed_to is None
    assert w.policy.observe("b.test", Signal.ERROR, None, 0.0).shed_to == 17
    # a second error: rate 1/4, limit 2 -> share 8 + 2 + 3 = 13, and 30 > 26
    assert w.policy.observe("a.test", Signal.ERROR, None, 0.0).shed_to == 13
    assert w.policy.observe("a.test", Signal.OK, None, 0.0).shed_to is None


def test_successes_bring_a_slowed_target_back_and_then_it_is_not_tracked() -> None:
    w = _World()
    w.sched.push("a.test", "job", 0.0)
    w.policy.observe("a.test", Signal.ERROR, None, 0.0)
    for _ in range(7):
        w.policy.observe("a.test", Signal.OK, None, 0.0)
    assert w.policy.interval("a.test") == pytest.approx(0.5 / (0.5 + 7 / 16))
    for _ in range(40):
        w.policy.observe("a.test", Signal.OK, None, 0.0)
    assert w.policy.interval("a.test") == pytest.approx(0.5)
    assert w.policy.health_of("a.test") is None


def test_healthy_and_neutral_signals_keep_no_state() -> None:
    w = _World()
    w.policy.observe("a.test", Signal.OK, None, 0.0)
    w.policy.observe("b.test", Signal.NEUTRAL, None, 0.0)
    assert w.policy.memory_counts()["target_health"] == 0


# --- rests and crawl windows -----------------------------------------------------------------


def test_a_short_rest_stays_in_memory_a_long_one_goes_to_disk_until_it_ends() -> None:
    w = _World()
    assert not w.policy.defer("a.test", 5.0, 0.0)
    assert w.sched.deferred_for("a.test", 0.0) == pytest.approx(5.0)
    assert w.policy.defer("b.test", 30.0, 0.0)
    assert w.policy.resting("b.test", 0.0) and not w.policy.resting("a.test", 0.0)
    assert w.policy.deferred_targets(1.0) == 2
    assert w.policy.deferred_targets(6.0) == 1
    assert w.policy.next_wake() == 30.0
    assert w.policy.due_wakes(29.0) == []
    assert w.policy.due_wakes(30.0) == ["b.test"]
    assert w.policy.next_wake() is None


def test_outside_its_crawl_window_a_target_waits_for_the_opening_at_most_an_hour() -> None:
    w = _World(crawl_windows={"w.test": "UTC 09:00-17:00"})
    day = datetime(2026, 3, 4, tzinfo=UTC)
    assert w.policy.window_wait("w.test", day.replace(hour=8, minute=30)) == 1800.0
    assert w.policy.window_wait("w.test", day.replace(hour=10)) == 0.0
    assert w.policy.window_wait("w.test", day.replace(hour=18)) == 3600.0
    assert w.policy.window_wait("other.test", day.replace(hour=3)) == 0.0


# --- forgetting: the bound, and no cap loosened ---------------------------------------------


def test_a_degraded_target_forgotten_early_gets_its_slowdown_back() -> None:
    w = _World(max_target_state=2)
    w.run_one("sick.test", 0.0)
    w.policy.observe("sick.test", Signal.ERROR, None, 0.0)  # interval 1 s now
    w.robots.on_rules("sick.test", 0.8)
    w.run_one("b.test", 0.5)
    assert w.policy.room_for("c.test", 2.0)  # the longest idle (sick.test) goes
    assert "sick.test" not in w.sched and w.policy.health_of("sick.test") is None
    assert "sick.test" in w.policy.resting_health
    assert w.policy.memory_counts()["robots_intervals"] == 0  # refetched with robots.txt
    # seen again: released once per 1 s (slowed), not per its cap's 0.5 s
    w.sched.push("sick.test", "again", 2.0)
    ((_, _),) = w.sched.pop_ready(2.0, 1)
    w.sched.done("sick.test", 2.0)
    w.sched.push("sick.test", "again2", 2.0)
    assert w.sched.pop_ready(2.9, 1) == []
    assert [t for t, _ in w.sched.pop_ready(3.0, 1)] == ["sick.test"]
    assert w.policy.health_of("sick.test") is not None and not w.policy.resting_health


def test_resting_health_expires_once_the_target_was_idle_long_enough() -> None:
    w = _World(max_target_state=2, target_idle_s=100.0)
    w.run_one("sick.test", 0.0)
    w.policy.observe("sick.test", Signal.ERROR, None, 0.0)
    w.run_one("b.test", 0.5)
    assert w.policy.room_for("c.test", 2.0)
    w.policy.forget_idle(99.0)  # idle 99 s: kept aside
    assert "sick.test" in w.policy.resting_health
    w.policy.forget_at = 0.0  # the sweep is due again
    w.policy.forget_idle(100.5)
    assert not w.policy.resting_health


def test_a_target_idle_long_goes_with_its_health_whatever_the_count() -> None:
    w = _World(target_idle_s=100.0)
    w.run_one("sick.test", 0.0)
    w.policy.observe("sick.test", Signal.ERROR, None, 0.0)
    w.policy.forget_idle(200.0)
    assert "sick.test" not in w.sched
    assert w.policy.memory_counts()["target_health"] == 0  # idle long: nothing to keep
    assert w.counters["targets_forgotten"] == 1


def test_health_of_many_degraded_forgotten_targets_stays_within_the_bound() -> None:
    w = _World(max_target_state=4)
    for n in range(20):
        now = float(n)
        target = f"h{n}.mint.test"
        assert w.policy.room_for(target, now)
        w.run_one(target, now)
        w.policy.observe(target, Signal.ERROR, None, now)
        counts = w.policy.memory_counts()
        assert counts["target_health"] <= 4 and counts["target_slots"] <= 4
    assert w.policy.memory_counts()["target_health_peak"] == 4
    # the oldest resting went first: the newest forgotten are the ones kept
    kept = set(w.policy.resting_health) | {t for t in w.policy.slots if w.policy.health_of(t)}
    assert "h0.mint.test" not in kept and "h19.mint.test" in kept


def test_a_target_with_work_or_a_rest_is_never_forgotten() -> None:
    w = _World(target_idle_s=0.001)
    w.sched.push("queued.test", "job", 0.0)
    w.policy.defer("resting.test", 5.0, 0.0)
    w.policy.forget_idle(1.0)
    assert "queued.test" in w.sched and "resting.test" in w.sched
    assert w.counters["targets_forgotten"] == 0
