"""Adaptive per-target back-off: slow on errors, never halt on an isolated one, recover."""

from __future__ import annotations

import random

import pytest

from consumers.fetch.adaptive import ESCALATE_AFTER, MAX_SLOWDOWN, TargetHealth
from consumers.fetch.classify import Signal, backoff


def test_starts_at_full_rate_and_limit() -> None:
    h = TargetHealth(max_inflight=8)
    assert h.slowdown == 1.0
    assert h.inflight_limit == 8
    assert not h.degraded


@pytest.mark.parametrize("signal", [Signal.ERROR, Signal.BLOCKED])
def test_an_isolated_error_slows_but_never_defers(signal: Signal) -> None:
    h = TargetHealth(max_inflight=8)
    assert h.observe(signal) == 0.0
    assert h.slowdown == 2.0
    assert h.inflight_limit == 4
    assert h.degraded


def test_successes_recover_gradually_to_full() -> None:
    h = TargetHealth(max_inflight=8)
    h.observe(Signal.ERROR)
    steps = 0
    while h.degraded:
        assert h.observe(Signal.OK) == 0.0
        steps += 1
        assert steps < 100
    assert steps > 1  # additive: not all at once
    assert h.slowdown == 1.0 and h.inflight_limit == 8


def test_repeated_errors_escalate_to_exponential_deferral() -> None:
    h = TargetHealth(max_inflight=8)
    waits = [h.observe(Signal.ERROR) for _ in range(ESCALATE_AFTER + 3)]
    assert waits[:ESCALATE_AFTER - 1] == [0.0] * (ESCALATE_AFTER - 1)
    assert waits[ESCALATE_AFTER - 1:] == [backoff(i) for i in range(4)]
    assert h.inflight_limit == 1
    assert h.slowdown == MAX_SLOWDOWN  # bounded: a slow site is still crawled


def test_a_success_resets_the_escalation() -> None:
    h = TargetHealth(max_inflight=8)
    for _ in range(ESCALATE_AFTER - 1):
        h.observe(Signal.ERROR)
    h.observe(Signal.OK)
    assert h.observe(Signal.ERROR) == 0.0  # 3% flaky pages never add up to a halt


def test_retry_after_defers_exactly_its_duration() -> None:
    h = TargetHealth(max_inflight=8)
    assert h.observe(Signal.ERROR, retry_after_s=3600.0) == 3600.0
    assert h.slowdown == 2.0  # and the target comes back slower


def test_throttled_without_retry_after_rests_at_once() -> None:
    h = TargetHealth(max_inflight=8)
    assert h.observe(Signal.THROTTLED) == backoff(0)
    assert h.observe(Signal.THROTTLED) == backoff(1)


def test_neutral_changes_nothing() -> None:
    h = TargetHealth(max_inflight=8)
    h.observe(Signal.ERROR)
    before = (h.rate, h.window, h.errors)
    assert h.observe(Signal.NEUTRAL) == 0.0
    assert (h.rate, h.window, h.errors) == before


@pytest.mark.parametrize("seed", range(20))
def test_limits_stay_in_bounds_under_any_sequence(seed: int) -> None:
    rng = random.Random(seed)
    h = TargetHealth(max_inflight=rng.randint(1, 16))
    for _ in range(500):
        sig = rng.choice(list(Signal))
        wait = h.observe(sig, rng.choice([None, None, 5.0]))
        assert wait >= 0.0
        assert 1 <= h.inflight_limit <= h.max_inflight
        assert 1.0 <= h.slowdown <= MAX_SLOWDOWN


def test_error_rate_of_three_percent_keeps_most_of_the_rate() -> None:
    """The flaky-site case: 3% of answers are 503s, the target never halts."""
    rng = random.Random(7)
    h = TargetHealth(max_inflight=8)
    slowdowns, deferred = [], 0.0
    for _ in range(10_000):
        deferred += h.observe(Signal.ERROR if rng.random() < 0.03 else Signal.OK)
        slowdowns.append(h.slowdown)
    assert deferred == 0.0
    assert sum(1 / s for s in slowdowns) / len(slowdowns) > 0.8
