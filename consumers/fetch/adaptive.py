"""Adaptive, polite back-off per target: pure logic, no clock of its own.

As large crawlers do (errors and 429s slow a site's crawl rate; Retry-After stops it for
the time given), each target has a rate fraction and an in-flight limit that drop
multiplicatively on every error signal and recover additively on successes, like TCP's
congestion window:

- an isolated 5xx, timeout, connection error or block *slows* its target, never halts it;
- ``ESCALATE_AFTER`` error signals in a row escalate to a deferral with exponential
  back-off (2 s, 4 s, 8 s ... capped), the "site keeps saying no" case;
- a Retry-After defers for its duration (and slows the target once it resumes).

The fetch stage turns :attr:`TargetHealth.slowdown` into the target's interval (cap or
Crawl-delay, times the slowdown) and :attr:`TargetHealth.inflight_limit` into the
scheduler's per-target concurrency bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from consumers.fetch.classify import Signal, backoff

#: The rate never drops below 1/MAX_SLOWDOWN of the target's cap by slowing alone.
MAX_SLOWDOWN = 32.0
#: Rate regained per success, as a fraction of the cap (from half rate: 8 successes).
RECOVERY_STEP = 1 / 16
#: Consecutive error signals after which the target is deferred, not only slowed.
ESCALATE_AFTER = 3


@dataclass
class TargetHealth:
    """One target's adaptive limits."""

    max_inflight: int
    rate: float = 1.0  # fraction of the target's cap in use, (1/MAX_SLOWDOWN, 1]
    window: float = 0.0  # in-flight limit, fractional so it can grow by 1/window
    errors: int = 0  # consecutive error signals

    def __post_init__(self) -> None:
        if self.window <= 0:
            self.window = float(self.max_inflight)

    @property
    def slowdown(self) -> float:
        """Multiplier of the target's interval (1 = full rate)."""
        return 1.0 / self.rate

    @property
    def inflight_limit(self) -> int:
        return max(1, min(self.max_inflight, math.floor(self.window)))

    @property
    def degraded(self) -> bool:
        return self.rate < 1.0 or self.inflight_limit < self.max_inflight

    def observe(self, signal: Signal, retry_after_s: float | None = None) -> float:
        """Record one request's signal; returns how long to defer the target (0: don't)."""
        if signal is Signal.NEUTRAL:
            return 0.0
        if signal is Signal.OK:
            self.errors = 0
            self.rate = min(1.0, self.rate + RECOVERY_STEP)
            self.window = min(float(self.max_inflight), self.window + 1.0 / self.window)
            return 0.0
        self.errors += 1
        self.rate = max(1.0 / MAX_SLOWDOWN, self.rate / 2)
        self.window = max(1.0, self.window / 2)
        if retry_after_s is not None and retry_after_s > 0:
            return retry_after_s  # the site said how long: exactly that
        if signal is Signal.THROTTLED:
            return backoff(self.errors - 1)  # a 429 without Retry-After: rest at once
        if self.errors >= ESCALATE_AFTER:
            return backoff(self.errors - ESCALATE_AFTER)
        return 0.0
