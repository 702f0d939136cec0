"""A fetch worker's per-target policy in one object: pure logic, no broker, no clock.

Every politeness and memory rule for a target is read here, as Scrapy's downloader reads a
site's concurrency and delay from its ``Slot``: the target's rate (its cap, robots.txt's
Crawl-delay, its adaptive slowdown), its in-flight limit, its rests, its crawl window, the
share of the worker's memory it may hold, and when its state is forgotten. The timing heap
stays in :class:`TargetScheduler`; this object decides what it is told. The fetch session
only wires the decisions to Kafka, the parked store and the status file.

Every per-target map (scheduler slots, robots.txt rules, Crawl-delay intervals, health) is
bounded by ``max_target_state`` where its entries are made, so a site minting hosts cannot
grow a worker's memory; forgetting never loosens a cap (only targets whose next request is
allowed anyway go, and a degraded target's health is kept aside until it has been idle
``target_idle_s``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from consumers.adaptive import TargetHealth
from consumers.classify import Signal
from consumers.parking import share_of
from consumers.robots_cache import RobotsCache
from consumers.scheduler import TargetScheduler
from core.config import Settings
from core.windows import parse_windows, seconds_until_open

#: A target deferred at least this long sends its queued jobs to disk until it may go again.
SPILL_AFTER_S = 10.0
#: Idle targets are looked for (and expired resting health dropped) this often.
FORGET_EVERY_S = 10.0
#: A new target that finds no room (every target state in use) waits on disk; the
#: scheduler is searched for idle targets to forget at most this often meanwhile.
ROOM_RETRY_S = 1.0
#: The longest a crawl window's wait defers its target at once (it is checked again then).
WINDOW_WAIT_CAP_S = 3600.0


@dataclass(frozen=True)
class Observed:
    """What a request's signal asks of the session: rest ``wait`` s (0: don't), and keep
    only ``shed_to`` of the target's queued jobs in memory (None: keep them all)."""

    wait: float = 0.0
    shed_to: int | None = None


class TargetPolicy:
    """Per-target rate, limits, rests, memory share and forgetting of one fetch worker.

    ``cap_of(target)`` is the target's live requests/s cap (the control topic's, else the
    settings'); ``count(name, n)`` adds to a status counter. The scheduler and the
    robots.txt cache are the worker's own; this object sets their intervals and limits and
    forgets their idle targets.
    """

    def __init__(self, s: Settings, sched: TargetScheduler[Any], robots: RobotsCache,
                 cap_of: Callable[[str], float],
                 count: Callable[[str, int], None] = lambda name, n: None) -> None:
        self.s = s
        self.sched = sched
        self.robots = robots
        self.cap_of = cap_of
        self.count = count
        self.share_ceiling = max(1, s.max_buffered // 2)
        self.windows = {t: parse_windows(w) for t, w in s.crawl_windows.items()}
        self.health: dict[str, TargetHealth] = {}  # targets with a scheduler slot
        # Degraded targets forgotten before they were idle target_idle_s: their health
        # (and when it may go), oldest forgotten first; a target seen again gets it back.
        self.resting_health: dict[str, tuple[float, TargetHealth]] = {}
        self.robots_interval: dict[str, float] = {}  # robots.txt's Crawl-delay/Request-rate
        self.robots_interval_peak = 0
        self.health_peak = 0
        self.deferred_until: dict[str, float] = {}  # for the deferred_targets gauge
        # Targets deferred long enough to have gone to disk: refill them when this is due.
        self.wake_at: list[tuple[float, str]] = []
        self.forget_at = 0.0
        self.room_retry_at = 0.0

    # --- rate -----------------------------------------------------------------------------

    def interval(self, target: str) -> float:
        """The stricter of the cap and robots.txt's Crawl-delay / Request-rate, stretched by
        the target's adaptive slowdown."""
        base = max(1.0 / self.cap_of(target), self.robots_interval.get(target, 0.0))
        h = self.health.get(target)
        return base * h.slowdown if h is not None else base

    def base_interval(self, target: str) -> float:
        """Interval of a target given a slot: one seen again gets its resting health back,
        so forgetting it loosened nothing."""
        resting = self.resting_health.pop(target, None)
        if resting is not None:
            self.health[target] = resting[1]
        return self.interval(target)

    def on_robots(self, target: str, min_interval_s: float) -> None:
        """robots.txt's Crawl-delay / Request-rate: the target's interval never drops below it."""
        self.robots_interval[target] = max(self.robots_interval.get(target, 0.0), min_interval_s)
        self.robots_interval_peak = max(self.robots_interval_peak, len(self.robots_interval))
        self.sched.set_interval(target, self.interval(target))

    def observe(self, target: str, signal: Signal, retry_after_s: float | None,
                now: float) -> Observed:
        """Feed a request's signal to the target's adaptive limits (errors slow it, successes
        bring it back); only targets that were degraded keep a health entry."""
        if signal is Signal.NEUTRAL:
            return Observed()
        h = self.health.get(target)
        if h is None:
            if signal is Signal.OK:
                return Observed()  # healthy and never degraded: nothing to track
            self._health_room()
            h = self.health[target] = TargetHealth(self.s.max_inflight_per_target)
            self._health_added()
        was = (h.slowdown, h.inflight_limit)
        wait = h.observe(signal, retry_after_s)
        if (h.slowdown, h.inflight_limit) != was:
            self.sched.set_interval(target, self.interval(target))
            self.sched.set_limit(target, h.inflight_limit, now)
        shed_to = None
        if signal is not Signal.OK:
            share = self.share(target)
            if self.sched.queued(target) > 2 * share:  # slowed a lot: keep its new share
                shed_to = share
        if not h.degraded and h.errors == 0:
            del self.health[target]
        return Observed(wait, shed_to)

    def defer(self, target: str, wait: float, now: float) -> bool:
        """No request to ``target`` for ``wait`` s; True if the rest is long enough that its
        queue should go to disk (it is refilled when :meth:`due_wakes` names it)."""
        self.sched.defer(target, now + wait)
        self.deferred_until[target] = max(self.deferred_until.get(target, 0.0), now + wait)
        if wait < SPILL_AFTER_S:
            return False
        heapq.heappush(self.wake_at, (now + wait, target))
        return True

    def resting(self, target: str, now: float) -> bool:
        """Whether ``target`` rests long enough that its parked jobs stay on disk."""
        return self.sched.deferred_for(target, now) >= SPILL_AFTER_S

    def due_wakes(self, now: float) -> list[str]:
        """Targets whose long rest ended: their parked work may come back."""
        out = []
        while self.wake_at and self.wake_at[0][0] <= now:
            out.append(heapq.heappop(self.wake_at)[1])
        return out

    def next_wake(self) -> float | None:
        return self.wake_at[0][0] if self.wake_at else None

    def deferred_targets(self, now: float) -> int:
        """Targets resting now (the gauge): the ones whose rest ended are dropped."""
        for target in [t for t, until in self.deferred_until.items() if until <= now]:
            del self.deferred_until[target]
        return len(self.deferred_until)

    def window_wait(self, target: str, at: datetime) -> float:
        """Seconds until ``target``'s crawl window opens (0: open, or it has none), at most
        ``WINDOW_WAIT_CAP_S``: outside it, its jobs wait rather than go."""
        windows = self.windows.get(target)
        if windows is None:
            return 0.0
        wait = seconds_until_open(windows, at)
        return min(wait, WINDOW_WAIT_CAP_S) if wait > 0 else 0.0

    # --- memory share ---------------------------------------------------------------------

    def share(self, target: str) -> int:
        """Jobs ``target`` may hold in memory: a few seconds at its current rate."""
        interval = self.interval(target)
        h = self.health.get(target)
        limit = h.inflight_limit if h is not None else self.s.max_inflight_per_target
        return share_of(1.0 / interval if interval > 0 else float("inf"),
                        self.s.target_buffer_s, self.s.target_buffer_floor, limit,
                        self.share_ceiling)

    def held(self, target: str, tier: int) -> int:
        """A tier's jobs in memory (and the target's in flight): each tier has its own
        share, so the scheduler's high:bulk mix always sees both."""
        return self.sched.queued(target, tier) + self.sched.inflight(target)

    def must_park(self, target: str, tier: int, now: float, behind_parked: bool) -> bool:
        """Whether a new job goes to disk: behind what is parked, beyond the target's share,
        or no room for one more target's state (it comes back with a refill)."""
        return behind_parked or self.held(target, tier) >= self.share(target) \
            or not self.room_for(target, now)

    def room_for(self, target: str, now: float) -> bool:
        """Whether ``target`` may hold a scheduler slot now: it has one, or one more fits
        in ``max_target_state``, or forgetting idle targets makes room. The bound holds
        where slots are made (a batch of new targets cannot overshoot it)."""
        bound = self.s.max_target_state
        if target in self.sched or self.sched.slot_count < bound:
            return True
        self.forget_idle(now, room=True)
        return self.sched.slot_count < bound

    # --- forgetting -----------------------------------------------------------------------

    def forget_idle(self, now: float, room: bool = False) -> None:
        """Forget idle targets every ``FORGET_EVERY_S``, and when a new target finds
        ``max_target_state`` in use (``room``): then the longest idle go until a tenth of
        the bound is free, so the scan of every slot runs once per that many new targets
        (and at most every ``ROOM_RETRY_S`` while none can go). Only targets with no work
        whose next request is allowed anyway (no cap is loosened); a degraded target's
        health rests aside until it was idle ``target_idle_s``."""
        bound = self.s.max_target_state
        if room:
            if now < self.room_retry_at:
                return
            keep = bound - max(1, bound // 10)
        else:
            if now < self.forget_at:
                return
            self.forget_at = now + FORGET_EVERY_S
            keep = bound
            self.resting_health = {t: r for t, r in self.resting_health.items() if r[0] > now}
        forgotten = self.sched.evict_idle(now, self.s.target_idle_s, keep)
        if room and self.sched.slot_count >= bound:
            self.room_retry_at = now + ROOM_RETRY_S
        for target, idle_for in forgotten:
            self.robots_interval.pop(target, None)
            self.robots.forget_target(target)
            h = self.health.pop(target, None)
            if h is not None and h.degraded and idle_for < self.s.target_idle_s:
                self._rest_health(target, h, now - idle_for + self.s.target_idle_s)
        if forgotten:
            self.count("targets_forgotten", len(forgotten))

    def _rest_health(self, target: str, h: TargetHealth, until: float) -> None:
        """Keep a forgotten degraded target's health until ``until``, within the bound
        (health of targets with a slot included): the oldest resting goes first."""
        self._health_room()
        self.resting_health[target] = (until, h)
        self._health_added()

    def _health_room(self) -> None:
        """Make room for one more health entry: the bound covers both maps, and targets
        with a slot (at most ``max_target_state``) go before resting ones."""
        while self.resting_health and \
                len(self.health) + len(self.resting_health) >= self.s.max_target_state:
            del self.resting_health[next(iter(self.resting_health))]

    def _health_added(self) -> None:
        self.health_peak = max(self.health_peak, len(self.health) + len(self.resting_health))

    def memory_counts(self) -> dict[str, int]:
        """Sizes of the per-target maps, each bounded by ``max_target_state``, and the
        largest each has been (``*_peak``, kept where entries are added)."""
        return {"target_slots": self.sched.slot_count, "robots_rules": len(self.robots),
                "robots_intervals": len(self.robots_interval),
                "target_health": len(self.health) + len(self.resting_health),
                "target_slots_peak": self.sched.slot_peak, "robots_rules_peak": self.robots.peak,
                "robots_intervals_peak": self.robots_interval_peak,
                "target_health_peak": self.health_peak}
