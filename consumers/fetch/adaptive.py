"""Adaptive, polite back-off per target: pure logic, no clock of its own.

As large crawlers do (errors and 429s slow a site's crawl rate; Retry-After stops it for
the time given), each target has a rate fraction and an in-flight limit that drop
multiplicatively on every error signal and recover additively on successes, like TCP's
congestion window:

- an isolated 5xx, timeout, connection error or block *slows* its target, never halts it;
- ``ESCALATE_AFTER`` error signals in a row escalate to a deferral with exponential
  back-off (2 s, 4 s, 8 s ... capped), the "site keeps saying no" case;
- a Retry-After defers for its duration (and slows the target once it resumes);
- an error signal counts once per URL (:meth:`TargetHealth.first_strike`): a URL failing
  again on its retry (a trap that always times out) tells nothing new about the site, so
  one broken page cannot hold its whole site at the slowest rate.

The fetch stage turns :attr:`TargetHealth.slowdown` into the target's interval (cap or
Crawl-delay, times the slowdown): back-off spaces request *starts*. The in-flight window
sizes the target's memory share; the scheduler's concurrency bound is the fixed
``max_inflight_per_target``, so a request hanging in its timeout never holds the target's
only slot while its other pages queue (at a longer interval, fewer requests overlap anyway:
in flight = answer time / interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from consumers.fetch.classify import Signal, backoff

#: The rate never drops below 1/MAX_SLOWDOWN of the target's cap by slowing alone.
MAX_SLOWDOWN = 32.0
#: Rate regained per success, as a fraction of the cap (from half rate: 8 successes).
RECOVERY_STEP = 1 / 16
#: Consecutive error signals after which the target is deferred, not only slowed.
ESCALATE_AFTER = 3
#: URLs whose error signal was counted, kept per degraded target (the newest).
STRUCK_KEEP = 16


@dataclass
class TargetHealth:
    """One target's adaptive limits."""

    max_inflight: int
    rate: float = 1.0  # fraction of the target's cap in use, (1/MAX_SLOWDOWN, 1]
    window: float = 0.0  # in-flight limit, fractional so it can grow by 1/window
    errors: int = 0  # consecutive error signals
    struck: list[int] = field(default_factory=list)  # hashes of URLs whose error counted

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

    def first_strike(self, url: str) -> bool:
        """Whether an error signal of ``url`` is the first kept for it (then it is kept:
        the newest ``STRUCK_KEEP``). A repeat is one broken page failing again, not news of
        the site: it is not counted again."""
        key = hash(url)
        if key in self.struck:
            return False
        self.struck.append(key)
        del self.struck[:-STRUCK_KEEP]
        return True

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
