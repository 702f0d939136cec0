"""One target's politeness state and the decisions on it: pure logic, no broker, no clock.

As Scrapy's downloader keeps a site's concurrency and delay in a ``Slot``, a
:class:`TargetSlot` holds what one fetch worker knows of one target: robots.txt's
Crawl-delay / Request-rate floor, its adaptive health (:class:`TargetHealth`, made only when
the target degrades), its rest and its crawl windows. Its decisions (interval, in-flight
limit, memory share, what to park or shed, how long a signal rests it, how long its window
keeps it waiting) take every time and cap as an argument, so each is testable alone.
:class:`consumers.fetch.target_policy.TargetPolicy` keeps the slots, bounds them and wires the
decisions to the scheduler.

A worker may hold 10,000 targets: a slot has ``__slots__`` (no instance dict) and exists
only while it holds something (a robots.txt answer, health, a rest); a target holding
nothing is read through a blank slot that is not kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from consumers.fetch.adaptive import TargetHealth
from consumers.fetch.classify import Signal
from consumers.fetch.parking import share_of
from core.config import Settings
from core.windows import CrawlWindow, seconds_until_open

#: The longest a crawl window's wait defers its target at once (it is checked again then).
WINDOW_WAIT_CAP_S = 3600.0


@dataclass(frozen=True)
class SlotLimits:
    """What every slot of a worker shares (from the settings): the in-flight limit of a
    healthy target, and a memory share's horizon, floor and ceiling."""

    max_inflight: int
    buffer_s: float
    buffer_floor: int
    share_ceiling: int

    @classmethod
    def of(cls, s: Settings) -> SlotLimits:
        return cls(s.max_inflight_per_target, s.target_buffer_s, s.target_buffer_floor,
                   max(1, s.max_buffered // 2))


class TargetSlot:
    """One target's policy state: ``robots_interval`` (robots.txt's Crawl-delay /
    Request-rate; None: no robots.txt heard since the slot was made), ``health`` (None:
    healthy, never degraded or recovered), ``rest_until`` (monotonic time its rest ends;
    None: no rest) and ``windows`` (its crawl windows from the settings; None: always open).

    Identities (the profiles a target is fetched as) are to be added here, next to the
    target's rate and limits.
    """

    __slots__ = ("health", "rest_until", "robots_interval", "windows")

    def __init__(self, windows: tuple[CrawlWindow, ...] | None = None) -> None:
        self.robots_interval: float | None = None
        self.health: TargetHealth | None = None
        self.rest_until: float | None = None
        self.windows = windows

    @property
    def empty(self) -> bool:
        """Holds nothing worth keeping (windows come back from the settings)."""
        return self.robots_interval is None and self.health is None and self.rest_until is None

    # --- rate and limits ------------------------------------------------------------------

    @property
    def slowdown(self) -> float:
        """Multiplier of the target's interval from its adaptive health (1: full rate)."""
        return self.health.slowdown if self.health is not None else 1.0

    def interval(self, cap: float) -> float:
        """Seconds between requests: the stricter of ``cap`` (requests/s) and robots.txt's
        floor, stretched by the adaptive slowdown."""
        base = max(1.0 / cap, self.robots_interval or 0.0)
        return base * self.health.slowdown if self.health is not None else base

    def inflight_limit(self, limits: SlotLimits) -> int:
        """The adaptive in-flight window (the health's, else the healthy maximum): it sizes
        the memory share; the scheduler bounds requests in flight by the maximum alone."""
        return self.health.inflight_limit if self.health is not None else limits.max_inflight

    def hear_robots(self, min_interval_s: float) -> None:
        """robots.txt's Crawl-delay / Request-rate: the floor only ever rises."""
        self.robots_interval = max(self.robots_interval or 0.0, min_interval_s)

    # --- memory share and parking ---------------------------------------------------------

    def share(self, cap: float, limits: SlotLimits) -> int:
        """Jobs the target may hold in memory: a few seconds at its current rate."""
        interval = self.interval(cap)
        return share_of(1.0 / interval if interval > 0 else float("inf"), limits.buffer_s,
                        limits.buffer_floor, self.inflight_limit(limits), limits.share_ceiling)

    def over_share(self, held: int, cap: float, limits: SlotLimits) -> bool:
        """Whether a new job goes to disk with ``held`` jobs of its queue already in memory."""
        return held >= self.share(cap, limits)

    def shed_to(self, signal: Signal, queued: int, cap: float,
                limits: SlotLimits) -> int | None:
        """After ``signal``: keep only the new share of ``queued`` jobs (None: keep them
        all). Only an error signal that left more than twice the share queued sheds."""
        if signal is Signal.OK or signal is Signal.NEUTRAL:
            return None
        share = self.share(cap, limits)
        return share if queued > 2 * share else None

    # --- adaptive health and rests --------------------------------------------------------

    def observe(self, signal: Signal, retry_after_s: float | None, limits: SlotLimits,
                url: str | None = None) -> float:
        """Feed a request's signal to the adaptive health (made on the first error signal,
        dropped once fully recovered); returns how long to rest the target (0: don't).
        An error of ``url`` already counted (its retry failing again) changes nothing but
        still rests the target for the Retry-After it brought."""
        if signal is Signal.NEUTRAL:
            return 0.0
        h = self.health
        if h is None:
            if signal is Signal.OK:
                return 0.0  # healthy and never degraded: nothing to track
            h = self.health = TargetHealth(limits.max_inflight)
        if signal is Signal.ERROR and url is not None and not h.first_strike(url):
            return retry_after_s if retry_after_s is not None and retry_after_s > 0 else 0.0
        wait = h.observe(signal, retry_after_s)
        if not h.degraded and h.errors == 0:
            self.health = None
        return wait

    def rest(self, until: float) -> None:
        """No request before ``until`` (a later rest is never shortened)."""
        self.rest_until = until if self.rest_until is None else max(self.rest_until, until)

    def rest_over(self, now: float) -> bool:
        """Whether the target has no rest at ``now`` (one that ended is dropped)."""
        if self.rest_until is not None and self.rest_until <= now:
            self.rest_until = None
        return self.rest_until is None

    def window_wait(self, at: datetime) -> float:
        """Seconds until a crawl window opens (0: open, or none), at most
        ``WINDOW_WAIT_CAP_S``: outside it, the target's jobs wait rather than go."""
        if self.windows is None:
            return 0.0
        wait = seconds_until_open(self.windows, at)
        return min(wait, WINDOW_WAIT_CAP_S) if wait > 0 else 0.0

    def forget(self) -> TargetHealth | None:
        """The target's scheduler state is forgotten: drop the robots.txt floor (fetched
        again with robots.txt) and return the health, for the caller to keep aside."""
        h, self.health, self.robots_interval = self.health, None, None
        return h
