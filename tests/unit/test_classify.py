"""What an HTTP status (and Retry-After) means for a job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from consumers.fetch.classify import (
    BASE_BACKOFF_S,
    MAX_BACKOFF_S,
    Signal,
    Verdict,
    backoff,
    classify_status,
    parse_retry_after,
)

NOW = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)
RETRY_AFTER_CAP = MAX_BACKOFF_S * 6


@pytest.mark.parametrize("status", [200, 201, 204, 206, 299])
def test_2xx_store(status: int) -> None:
    out = classify_status(status, None, 0)
    assert out.verdict is Verdict.STORE
    assert out.reason == "ok"
    assert out.signal is Signal.OK
    assert out.delay_s == 0.0


@pytest.mark.parametrize("status", [400, 401, 404, 410, 451])
def test_definitive_4xx_store_as_a_healthy_answer(status: int) -> None:
    out = classify_status(status, "120", 0)
    assert out.verdict is Verdict.STORE
    assert out.reason == f"http_{status}"
    assert out.signal is Signal.OK  # a 404 says the site works
    assert out.delay_s == 0.0
    assert out.retry_after_s is None


def test_403_is_blocked_not_success() -> None:
    out = classify_status(403, None, 0)
    assert out.verdict is Verdict.STORE
    assert out.reason == "http_403"
    assert out.blocked
    assert out.signal is Signal.BLOCKED


def test_block_statuses_are_configurable() -> None:
    assert classify_status(451, None, 0, block_statuses=frozenset({403, 451})).blocked
    assert not classify_status(403, None, 0, block_statuses=frozenset({451})).blocked
    # A 503 configured as a block is stored, not retried, and never a success.
    out = classify_status(503, None, 0, block_statuses=frozenset({503}))
    assert out.verdict is Verdict.STORE
    assert out.signal is Signal.BLOCKED


@pytest.mark.parametrize("status", [429, 503])
def test_pushback_retry_with_retry_after_seconds(status: int) -> None:
    out = classify_status(status, "120", 0, now=NOW)
    assert out.verdict is Verdict.RETRY
    assert out.reason == f"http_{status}"
    assert out.delay_s == 120.0
    assert out.retry_after_s == 120.0
    assert out.signal is (Signal.THROTTLED if status == 429 else Signal.ERROR)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_http_date(status: int) -> None:
    when = NOW + timedelta(seconds=90)
    header = when.strftime("%a, %d %b %Y %H:%M:%S GMT")
    out = classify_status(status, header, 0, now=NOW)
    assert out.verdict is Verdict.RETRY
    assert out.delay_s == pytest.approx(90.0)
    assert out.retry_after_s == pytest.approx(90.0)


def test_retry_after_wins_over_backoff_regardless_of_attempt() -> None:
    assert classify_status(429, "5", 8, now=NOW).delay_s == 5.0


@pytest.mark.parametrize("status", [408, 425, 500, 502, 504, 520, 524])
def test_retryable_error_delays_the_job_not_the_target(status: int) -> None:
    out = classify_status(status, None, 0)
    assert out.verdict is Verdict.RETRY
    assert out.reason == f"http_{status}"
    assert out.signal is Signal.ERROR
    assert out.retry_after_s is None  # nothing asks the whole target to rest
    assert out.delay_s == BASE_BACKOFF_S


def test_other_5xx_retry_with_backoff() -> None:
    out = classify_status(507, None, 2)
    assert out.verdict is Verdict.RETRY
    assert out.reason == "http_507"
    assert out.delay_s == backoff(2)


def test_backoff_grows_with_attempt_and_is_capped() -> None:
    waits = [classify_status(503, None, a).delay_s for a in range(15)]
    assert waits[0] == BASE_BACKOFF_S
    assert waits[1] == 2 * BASE_BACKOFF_S
    for a, b in pairwise(waits):
        assert b >= a
    assert any(b > a for a, b in pairwise(waits))
    assert max(waits) == MAX_BACKOFF_S
    assert waits[-1] == MAX_BACKOFF_S
    assert backoff(10_000) == MAX_BACKOFF_S
    assert backoff(-3) == BASE_BACKOFF_S


def test_unparseable_retry_after_falls_back_to_backoff() -> None:
    out = classify_status(429, "soon, please", 3, now=NOW)
    assert out.verdict is Verdict.RETRY
    assert out.delay_s == backoff(3)
    assert out.retry_after_s is None
    assert out.signal is Signal.THROTTLED


@pytest.mark.parametrize("status", [42, 0, -1, 99, 600, 700, 999])
def test_impossible_status_is_dead(status: int) -> None:
    out = classify_status(status, None, 0)
    assert out.verdict is Verdict.DEAD
    assert out.reason == "protocol_error"


@pytest.mark.parametrize("status", [100, 301, 304])
def test_unexpected_1xx_3xx_is_dead(status: int) -> None:
    out = classify_status(status, None, 0)
    assert out.verdict is Verdict.DEAD
    assert out.reason == f"unexpected_{status}"


# --- parse_retry_after --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        ("30", 30.0),
        (" 120 ", 120.0),
        ("99999999", RETRY_AFTER_CAP),
        ("9" * 5000, RETRY_AFTER_CAP),  # longer than int()'s digit limit
        ("Fri, 01 Mar 2024 12:01:00 GMT", 60.0),
        ("Fri, 01 Mar 2024 11:00:00 GMT", 0.0),  # in the past: no wait
        ("Fri, 01 Mar 2024 12:00:30", 30.0),  # no zone: taken as UTC
        ("Sat, 01 Mar 2025 12:00:00 GMT", RETRY_AFTER_CAP),  # far future: capped
    ],
)
def test_parse_retry_after(value: str, seconds: float) -> None:
    assert parse_retry_after(value, NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "soon", "-5", "1.5", "1e3", "²", "\u0661\u0662x",
                                   "Mon, 99 Foo 2024 99:99:99 GMT",
                                   "Wed, 21 Oct 2015 25:28:00 GMT"])
def test_parse_retry_after_garbage_is_none(value: str) -> None:
    assert parse_retry_after(value, NOW) is None


def test_hostile_retry_after_does_not_crash_classification() -> None:
    out = classify_status(503, "²", 1, now=NOW)
    assert out.verdict is Verdict.RETRY
    assert out.delay_s == backoff(1)


def test_a_407_is_the_proxys_answer_retried_and_never_a_signal_about_the_site() -> None:
    out = classify_status(407, None, 0)
    assert out.verdict is Verdict.RETRY and out.reason == "http_407"
    assert out.signal is Signal.NEUTRAL  # the target is not slowed for its proxy's refusal
