"""Failure classification in one place: what an HTTP answer means for the job.

Retry rules are data (the tables below), the attempt count travels on the job, and unknown
statuses are classified explicitly instead of trusting ranges (aiohttp accepts ``042``).
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

#: Statuses worth another try later, with the back-off they imply.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524})
#: Statuses that mean "the site pushes back": defer the whole target, not just the job.
PUSHBACK_STATUSES = frozenset({429, 503})
BASE_BACKOFF_S = 2.0
MAX_BACKOFF_S = 600.0


class Verdict(Enum):
    STORE = "store"  # a final answer (2xx, or a definitive 4xx such as 404)
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str
    wait_s: float = 0.0  # how long the target should rest (Retry-After or back-off)
    pushback: bool = False


def classify_status(status: int, retry_after: str | None, attempt: int,
                    now: datetime | None = None) -> Outcome:
    """What to do with a response of ``status`` on attempt number ``attempt`` (0-based)."""
    if not 100 <= status <= 599:
        return Outcome(Verdict.DEAD, "bad_status")
    if 200 <= status <= 299:
        return Outcome(Verdict.STORE, "ok")
    if status in RETRY_STATUSES:
        wait = parse_retry_after(retry_after, now) if retry_after else None
        if wait is None:
            wait = backoff(attempt)
        return Outcome(Verdict.RETRY, f"http_{status}", wait, status in PUSHBACK_STATUSES)
    if 400 <= status <= 499:
        return Outcome(Verdict.STORE, f"http_{status}", pushback=status == 403)
    if 500 <= status <= 599:
        return Outcome(Verdict.RETRY, f"http_{status}", backoff(attempt))
    # 1xx/3xx reaching here: redirects are followed by the fetcher; anything else is odd.
    return Outcome(Verdict.DEAD, f"unexpected_{status}")


def backoff(attempt: int) -> float:
    """Exponential back-off for attempt ``attempt`` (0-based), capped."""
    exponent = min(max(0, attempt), 64)  # 2.0 * 2**1024 would overflow a float
    return float(min(MAX_BACKOFF_S, BASE_BACKOFF_S * (2 ** exponent)))


def parse_retry_after(value: str, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date)."""
    value = value.strip()
    # ASCII only ("²".isdigit() but int() rejects it); float() has no digit-count limit.
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_BACKOFF_S * 6)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, min(delta, MAX_BACKOFF_S * 6))
