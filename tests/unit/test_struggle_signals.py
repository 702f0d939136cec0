"""What slows a target and how (issue 43 point 3): an error counts once per URL, a prompt
answer with broken bytes is no struggle signal, and back-off spaces request starts without
serialising them behind one that hangs in its timeout. No broker, no clock (plain numbers);
expected values are worked out by hand from cap 2/s (interval 0.5 s) and 8 in flight."""

from __future__ import annotations

import itertools

import pytest

from consumers.fetch.adaptive import ESCALATE_AFTER, STRUCK_KEEP, TargetHealth
from consumers.fetch.classify import Signal, classify_status, error_signal
from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import TargetScheduler
from consumers.fetch.target_policy import TargetPolicy
from consumers.fetch.target_slot import SlotLimits, TargetSlot
from core.config import Settings
from core.errors import (
    ConnectError,
    CrawlfleetError,
    DecompressionBombError,
    FetchTimeoutError,
    ForbiddenAddressError,
    HeadersTooLargeError,
    InvalidURLError,
    ProtocolError,
    ResponseTooLargeError,
    RobotsDisallowedError,
    TooManyRedirectsError,
    TruncatedBodyError,
)

LIMITS = SlotLimits(max_inflight=8, buffer_s=5.0, buffer_floor=8, share_ceiling=2500)


# --- once per URL ----------------------------------------------------------------------------


def test_first_strike_is_true_once_per_url_and_bounded() -> None:
    h = TargetHealth(max_inflight=8)
    assert h.first_strike("http://a.test/drip")
    assert not h.first_strike("http://a.test/drip")
    assert h.first_strike("http://a.test/silent")
    for n in range(STRUCK_KEEP):
        h.first_strike(f"http://a.test/{n}")
    assert len(h.struck) == STRUCK_KEEP
    assert h.first_strike("http://a.test/drip")  # forgotten as the oldest: counts again


def test_a_url_failing_on_every_retry_slows_its_target_once() -> None:
    slot = TargetSlot()
    waits = [slot.observe(Signal.ERROR, None, LIMITS, "http://a.test/drip") for _ in range(3)]
    assert waits == [0.0, 0.0, 0.0]
    assert slot.slowdown == pytest.approx(2.0)  # one halving, not three
    assert slot.health is not None and slot.health.errors == 1


def test_distinct_failing_urls_still_slow_and_escalate() -> None:
    slot = TargetSlot()
    waits = [slot.observe(Signal.ERROR, None, LIMITS, f"http://a.test/{n}")
             for n in range(ESCALATE_AFTER)]
    assert slot.slowdown == pytest.approx(2.0 ** ESCALATE_AFTER)
    assert waits[-1] > 0  # a site failing on page after page is rested, as before


def test_errors_without_a_url_count_every_time() -> None:
    slot = TargetSlot()
    for _ in range(3):
        slot.observe(Signal.ERROR, None, LIMITS)
    assert slot.slowdown == pytest.approx(8.0)


def test_a_repeat_error_still_rests_for_its_retry_after() -> None:
    slot = TargetSlot()
    slot.observe(Signal.ERROR, None, LIMITS, "http://a.test/p")
    before = slot.slowdown
    assert slot.observe(Signal.ERROR, 30.0, LIMITS, "http://a.test/p") == 30.0
    assert slot.slowdown == before


def test_throttling_counts_every_time_even_for_one_url() -> None:
    slot = TargetSlot()
    waits = [slot.observe(Signal.THROTTLED, None, LIMITS, "http://a.test/p") for _ in range(3)]
    assert slot.slowdown == pytest.approx(8.0)
    assert waits == sorted(waits) and waits[0] > 0  # each 429 rests it longer


# --- which answers are struggle signals ------------------------------------------------------


@pytest.mark.parametrize("exc", [FetchTimeoutError("t"), ConnectError("c"),
                                 TruncatedBodyError("b")])
def test_no_answer_in_time_is_an_error_signal(exc: CrawlfleetError) -> None:
    assert error_signal(exc) is Signal.ERROR


@pytest.mark.parametrize("exc", [ProtocolError("p"), HeadersTooLargeError("h"),
                                 ResponseTooLargeError("l"), DecompressionBombError("d"),
                                 TooManyRedirectsError("r")])
def test_a_prompt_answer_with_broken_bytes_does_not_slow_its_site(exc: CrawlfleetError) -> None:
    assert error_signal(exc) is Signal.OK


@pytest.mark.parametrize("exc", [RobotsDisallowedError("r"), ForbiddenAddressError("f"),
                                 InvalidURLError("u")])
def test_our_own_refusals_say_nothing(exc: CrawlfleetError) -> None:
    assert error_signal(exc) is Signal.NEUTRAL


def test_an_impossible_status_is_dead_but_no_struggle_signal() -> None:
    out = classify_status(42, None, 0)
    assert out.reason == "protocol_error" and out.signal is not Signal.ERROR
    assert classify_status(503, None, 0).signal is Signal.ERROR  # a 5xx still is one


# --- back-off spaces starts, never serialises on completion ----------------------------------


def _policy() -> tuple[TargetPolicy, TargetScheduler[str]]:
    s = Settings(rate_cap=2.0)
    holder: list[TargetPolicy] = []
    sched: TargetScheduler[str] = TargetScheduler(lambda t: holder[0].base_interval(t),
                                                  limit=s.max_inflight_per_target)
    robots = RobotsCache("crawlfleet", 3600.0, lambda t, i: holder[0].on_robots(t, i),
                         max_origins=s.max_target_state)
    holder.append(TargetPolicy(s, sched, robots, s.cap_for, lambda n, k: None))
    return holder[0], sched


def test_hung_requests_do_not_hold_a_degraded_target_while_its_starts_stay_spaced() -> None:
    """Timeouts of three URLs (interval 0.5 s x 8 = 4 s); then nothing finishes (every
    request hangs): the scheduler still starts the target's other jobs, 4 s apart, up to
    ``max_inflight_per_target`` in flight, never more, never closer together."""
    policy, sched = _policy()
    now = 0.0
    for n in range(3):
        policy.observe("a.test", Signal.ERROR, None, now, f"http://a.test/timeout{n}")
    assert policy.interval("a.test") == pytest.approx(4.0)
    for n in range(20):
        sched.push("a.test", f"p{n}", now)
    starts = []
    t = now
    while t < now + 60:
        starts += [t for _ in sched.pop_ready(t, 10)]  # none of them is ever done
        t = round(t + 0.01, 2)
    assert len(starts) == 8  # the hard cap on connections holds
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(g >= 4.0 - 1e-9 for g in gaps), gaps
    assert starts[-1] - starts[0] < 7 * 4.0 + 0.1  # nothing waited for a hung request


def test_retries_of_one_trap_leave_its_site_at_half_rate() -> None:
    """The hostile site's four retryable traps, three attempts each, between good pages:
    each slows its site once, so the site's slowdown is that of four errors, never the
    floor twelve would drive it to, and good answers bring it back."""
    policy, _ = _policy()
    traps = [f"http://a.test/{p}" for p in ("drip", "silent", "wrong-length", "chunk-cut")]
    for attempt in range(3):
        for url in traps:
            policy.observe("a.test", Signal.ERROR, None, float(attempt), url)
    health = policy.health_of("a.test")
    assert health is not None and health.slowdown == pytest.approx(16.0)
    for _ in range(16):
        policy.observe("a.test", Signal.OK, None, 5.0, "http://a.test/good")
    assert policy.interval("a.test") == pytest.approx(0.5)
