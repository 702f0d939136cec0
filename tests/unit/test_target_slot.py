"""One target's slot alone: no scheduler, no clock (times are plain numbers), no broker.
Its interval (cap, robots.txt floor, adaptive slowdown), in-flight limit, memory share and
what it parks or sheds, the rest a signal asks for, rests and crawl windows; then how the
policy keeps slots only for targets that hold something. Expected values are worked out by
hand: cap 2/s (interval 0.5 s), 5 s of work plus a floor of 8 plus the in-flight limit (8)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from consumers.fetch.adaptive import TargetHealth
from consumers.fetch.classify import Signal
from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import TargetScheduler
from consumers.fetch.target_policy import TargetPolicy
from consumers.fetch.target_slot import WINDOW_WAIT_CAP_S, SlotLimits, TargetSlot
from core.config import Settings
from core.windows import parse_windows

LIMITS = SlotLimits(max_inflight=8, buffer_s=5.0, buffer_floor=8, share_ceiling=2500)


def _degraded(errors: int) -> TargetSlot:
    slot = TargetSlot()
    for _ in range(errors):
        slot.observe(Signal.ERROR, None, LIMITS)
    return slot


def test_limits_come_from_the_settings() -> None:
    s = Settings(max_inflight_per_target=3, target_buffer_s=7.0, target_buffer_floor=2,
                 max_buffered=41)
    assert SlotLimits.of(s) == SlotLimits(3, 7.0, 2, 20)


# --- rate and limits -------------------------------------------------------------------------


def test_interval_is_the_stricter_of_cap_and_robots_floor() -> None:
    slot = TargetSlot()
    assert slot.interval(2.0) == pytest.approx(0.5)
    slot.hear_robots(3.0)
    assert slot.interval(2.0) == pytest.approx(3.0)  # Crawl-delay stricter than the cap
    assert slot.interval(0.1) == pytest.approx(10.0)  # the cap stricter than Crawl-delay
    slot.hear_robots(1.0)  # a later, smaller delay does not loosen it
    assert slot.robots_interval == 3.0 and slot.interval(2.0) == pytest.approx(3.0)


def test_a_robots_txt_without_a_delay_is_remembered_and_changes_nothing() -> None:
    slot = TargetSlot()
    slot.hear_robots(0.0)
    assert slot.robots_interval == 0.0 and not slot.empty
    assert slot.interval(2.0) == pytest.approx(0.5)


def test_the_slowdown_stretches_the_stricter_interval() -> None:
    slot = _degraded(2)  # rate 1/4
    assert slot.slowdown == pytest.approx(4.0)
    assert slot.interval(2.0) == pytest.approx(2.0)
    slot.hear_robots(3.0)
    assert slot.interval(2.0) == pytest.approx(12.0)


def test_inflight_limit_is_the_healthy_maximum_until_errors_halve_it() -> None:
    assert TargetSlot().inflight_limit(LIMITS) == 8
    assert _degraded(1).inflight_limit(LIMITS) == 4
    assert _degraded(3).inflight_limit(LIMITS) == 1


# --- memory share and parking ----------------------------------------------------------------


def test_share_is_a_few_seconds_at_the_current_rate_within_the_ceiling() -> None:
    assert TargetSlot().share(2.0, LIMITS) == 8 + 8 + 10  # 2/s for 5 s
    assert TargetSlot().share(0.1, LIMITS) == 8 + 8 + 1  # half a job, rounded up
    assert TargetSlot().share(1000.0, LIMITS) == 2500  # the ceiling
    assert _degraded(1).share(2.0, LIMITS) == 8 + 4 + 5  # limit 4, 1/s for 5 s
    floored = TargetSlot()
    floored.hear_robots(2.5)
    assert floored.share(2.0, LIMITS) == 8 + 8 + 2  # 0.4/s for 5 s


def test_a_job_parks_once_its_tier_holds_the_share() -> None:
    slot = TargetSlot()
    assert not slot.over_share(25, 2.0, LIMITS)
    assert slot.over_share(26, 2.0, LIMITS)
    assert _degraded(1).over_share(17, 2.0, LIMITS)


def test_an_error_sheds_to_the_new_share_only_what_is_far_beyond_it() -> None:
    slot = _degraded(1)  # share 17
    assert slot.shed_to(Signal.ERROR, 34, 2.0, LIMITS) is None  # within twice the share
    assert slot.shed_to(Signal.ERROR, 35, 2.0, LIMITS) == 17
    assert slot.shed_to(Signal.THROTTLED, 60, 2.0, LIMITS) == 17
    assert slot.shed_to(Signal.OK, 60, 2.0, LIMITS) is None
    assert slot.shed_to(Signal.NEUTRAL, 60, 2.0, LIMITS) is None


# --- adaptive health and rests ---------------------------------------------------------------


def test_healthy_and_neutral_signals_make_no_health() -> None:
    slot = TargetSlot()
    assert slot.observe(Signal.OK, None, LIMITS) == 0.0
    assert slot.observe(Signal.NEUTRAL, 30.0, LIMITS) == 0.0
    assert slot.health is None and slot.empty


def test_errors_slow_then_escalate_to_rests_and_retry_after_is_exact() -> None:
    slot = TargetSlot()
    waits = [slot.observe(Signal.ERROR, None, LIMITS) for _ in range(4)]
    assert waits == [0.0, 0.0, 2.0, 4.0]
    assert slot.health is not None and slot.health.degraded and not slot.empty
    assert TargetSlot().observe(Signal.THROTTLED, None, LIMITS) == 2.0
    assert TargetSlot().observe(Signal.BLOCKED, 30.0, LIMITS) == 30.0


def test_a_recovered_target_drops_its_health() -> None:
    slot = _degraded(1)
    for _ in range(7):
        slot.observe(Signal.OK, None, LIMITS)
    assert slot.interval(2.0) == pytest.approx(0.5 / (0.5 + 7 / 16))
    for _ in range(40):
        slot.observe(Signal.OK, None, LIMITS)
    assert slot.health is None and slot.empty
    assert slot.interval(2.0) == pytest.approx(0.5)


def test_a_rest_is_never_shortened_and_is_dropped_once_over() -> None:
    slot = TargetSlot()
    assert slot.rest_over(0.0)
    slot.rest(30.0)
    slot.rest(5.0)
    assert slot.rest_until == 30.0 and not slot.empty
    assert not slot.rest_over(29.9)
    assert slot.rest_over(30.0) and slot.rest_until is None and slot.empty


def test_outside_its_windows_a_slot_waits_for_the_opening_at_most_the_cap() -> None:
    day = datetime(2026, 3, 4, tzinfo=UTC)
    slot = TargetSlot(parse_windows("UTC 09:00-17:00"))
    assert slot.window_wait(day.replace(hour=8, minute=30)) == 1800.0
    assert slot.window_wait(day.replace(hour=10)) == 0.0
    assert slot.window_wait(day.replace(hour=18)) == WINDOW_WAIT_CAP_S == 3600.0
    assert TargetSlot().window_wait(day.replace(hour=3)) == 0.0
    assert slot.empty  # windows come from the settings: nothing to keep


def test_forgetting_returns_the_health_and_drops_the_floor_not_the_rest() -> None:
    slot = _degraded(1)
    slot.hear_robots(3.0)
    slot.rest(10.0)
    h = slot.forget()
    assert isinstance(h, TargetHealth) and h.degraded
    assert slot.health is None and slot.robots_interval is None and slot.rest_until == 10.0
    assert TargetSlot().forget() is None


def test_a_slot_has_no_instance_dict() -> None:
    assert not hasattr(TargetSlot(), "__dict__")


# --- the policy keeps slots only for targets that hold something -------------------------------


def _policy(**overrides: Any) -> tuple[TargetPolicy, RobotsCache]:
    s = Settings(**{"rate_cap": 2.0, **overrides})
    box: list[TargetPolicy] = []
    sched: TargetScheduler[str] = TargetScheduler(lambda t: box[0].base_interval(t))
    robots = RobotsCache("crawlfleet", 3600.0, lambda t, i: box[0].on_robots(t, i))
    box.append(TargetPolicy(s, sched, robots, s.cap_for))
    return box[0], robots


def test_a_healthy_target_with_nothing_heard_holds_no_slot() -> None:
    policy, _ = _policy(crawl_windows={"w.test": "UTC 09:00-17:00"})
    for target in ("a.test", "w.test"):
        policy.observe(target, Signal.OK, None, 0.0)
        assert policy.share(target) == 26 and policy.interval(target) == pytest.approx(0.5)
    assert policy.window_wait("w.test", datetime(2026, 3, 4, 18, tzinfo=UTC)) == 3600.0
    assert policy.slots == {}


def test_each_slot_goes_once_it_holds_nothing_and_the_gauges_follow() -> None:
    policy, robots = _policy()
    policy.observe("sick.test", Signal.ERROR, None, 0.0)
    robots.on_rules("delay.test", 3.0)
    assert policy.defer("rest.test", 2.0, 0.0) is False
    assert set(policy.slots) == {"sick.test", "delay.test", "rest.test"}
    counts = policy.memory_counts()
    assert (counts["target_health"], counts["robots_intervals"]) == (1, 1)
    for _ in range(40):
        policy.observe("sick.test", Signal.OK, None, 0.0)
    assert policy.deferred_targets(1.0) == 1
    assert policy.deferred_targets(2.0) == 0
    assert set(policy.slots) == {"delay.test"}
    assert policy.memory_counts()["target_health"] == 0
    assert policy.memory_counts()["target_health_peak"] == 1
