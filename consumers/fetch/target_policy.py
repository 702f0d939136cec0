"""A fetch worker's per-target policy: the registry of its targets' slots, no broker, no clock.

Every politeness and memory rule for a target is decided by its :class:`TargetSlot`, as
Scrapy's downloader reads a site's concurrency and delay from its ``Slot``: the target's
rate (its cap, robots.txt's Crawl-delay, its adaptive slowdown), its in-flight limit, its
rests, its crawl window and the share of the worker's memory it may hold. This object keeps
the slots, decides when a target's state is forgotten, keeps the gauges, and tells the
:class:`TargetScheduler` (which keeps the timing heap) and the robots.txt cache what the
slots decide. The fetch session only wires the decisions to Kafka, the parked store and the
status file.

It also owns the worker's :class:`Identities` (who each request goes as: cookie jars per
(target, profile), placement, egress choice and health), forgotten with the rest of a
target's state.

Every per-target map (scheduler slots, robots.txt rules, policy slots, resting health,
identities) is bounded by ``max_target_state`` where its entries are made, so a site
minting hosts cannot grow a worker's memory; forgetting never loosens a cap (only targets
whose next request is allowed anyway go, and a degraded target's health is kept aside
until it has been idle ``target_idle_s``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from consumers.fetch.adaptive import TargetHealth
from consumers.fetch.classify import Signal
from consumers.fetch.identities import Identities
from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import TargetScheduler
from consumers.fetch.target_slot import WINDOW_WAIT_CAP_S as WINDOW_WAIT_CAP_S
from consumers.fetch.target_slot import SlotLimits, TargetSlot
from core.config import Settings
from core.windows import parse_windows

#: A target deferred at least this long sends its queued jobs to disk until it may go again.
SPILL_AFTER_S = 10.0
#: Idle targets are looked for (and expired resting health dropped) this often.
FORGET_EVERY_S = 10.0
#: A new target that finds no room (every target state in use) waits on disk; the
#: scheduler is searched for idle targets to forget at most this often meanwhile.
ROOM_RETRY_S = 1.0
#: How a target holding nothing is read (never changed: a target's state goes in its own).
_BLANK = TargetSlot()


@dataclass(frozen=True)
class Observed:
    """What a request's signal asks of the session: rest ``wait`` s (0: don't), and keep
    only ``shed_to`` of the target's queued jobs in memory (None: keep them all)."""

    wait: float = 0.0
    shed_to: int | None = None


class TargetPolicy:
    """The slots of one fetch worker's targets: made where there is something to hold,
    bounded, forgotten when idle, and their decisions wired to the scheduler.

    ``cap_of(target)`` is the target's live requests/s cap (the control topic's, else the
    settings'); ``count(name, n)`` adds to a status counter. The scheduler and the
    robots.txt cache are the worker's own; this object sets their intervals and limits and
    forgets their idle targets.

    ``slots`` holds a :class:`TargetSlot` for each target that holds something: its
    robots.txt answer, its adaptive health, a rest. ``resting_health`` keeps degraded
    targets forgotten before they were idle ``target_idle_s``: their health (and when it may
    go), oldest forgotten first; a target seen again gets it back.
    """

    def __init__(self, s: Settings, sched: TargetScheduler[Any], robots: RobotsCache,
                 cap_of: Callable[[str], float],
                 count: Callable[[str, int], None] = lambda name, n: None) -> None:
        self.s = s
        self.sched = sched
        self.robots = robots
        self.cap_of = cap_of
        self.count = count
        self.limits = SlotLimits.of(s)
        self.share_ceiling = self.limits.share_ceiling
        self.windows = {t: parse_windows(w) for t, w in s.crawl_windows.items()}
        self.slots: dict[str, TargetSlot] = {}
        self.resting_health: dict[str, tuple[float, TargetHealth]] = {}
        # Sizes kept as slots change, so the gauges read every loop never scan the slots.
        self._floors = 0  # slots with a robots.txt answer (Crawl-delay / Request-rate)
        self._healths = 0  # slots with health
        self._rested: set[str] = set()  # slots with a rest (for the deferred_targets gauge)
        self.robots_interval_peak = 0
        self.health_peak = 0
        # Targets deferred long enough to have gone to disk: refill them when this is due.
        self.wake_at: list[tuple[float, str]] = []
        self.forget_at = 0.0
        self.room_retry_at = 0.0
        self.identities = Identities.of(s)

    # --- slots ----------------------------------------------------------------------------

    def _view(self, target: str) -> TargetSlot:
        """``target``'s slot to read; a blank one (not kept) if it holds nothing."""
        slot = self.slots.get(target)
        if slot is not None:
            return slot
        windows = self.windows.get(target)
        return _BLANK if windows is None else TargetSlot(windows)

    def _slot(self, target: str) -> TargetSlot:
        """``target``'s slot to change: made (with its windows) if it has none."""
        slot = self.slots.get(target)
        if slot is None:
            slot = self.slots[target] = TargetSlot(self.windows.get(target))
        return slot

    def health_of(self, target: str) -> TargetHealth | None:
        """The adaptive health of a target with a slot (None: healthy, or resting aside)."""
        slot = self.slots.get(target)
        return slot.health if slot is not None else None

    # --- rate -----------------------------------------------------------------------------

    def interval(self, target: str) -> float:
        """The stricter of the cap and robots.txt's Crawl-delay / Request-rate, stretched by
        the target's adaptive slowdown."""
        return self._view(target).interval(self.cap_of(target))

    def base_interval(self, target: str) -> float:
        """Interval of a target given a slot: one seen again gets its resting health back,
        so forgetting it loosened nothing."""
        resting = self.resting_health.pop(target, None)
        if resting is not None:
            slot = self._slot(target)
            if slot.health is None:
                self._healths += 1
            slot.health = resting[1]
        return self.interval(target)

    def on_robots(self, target: str, min_interval_s: float) -> None:
        """robots.txt's Crawl-delay / Request-rate: the target's interval never drops below it."""
        slot = self._slot(target)
        if slot.robots_interval is None:
            self._floors += 1
        slot.hear_robots(min_interval_s)
        self.robots_interval_peak = max(self.robots_interval_peak, self._floors)
        self.sched.set_interval(target, self.interval(target))

    def observe(self, target: str, signal: Signal, retry_after_s: float | None,
                now: float, url: str | None = None) -> Observed:
        """Feed a request's signal (of ``url``: an error counts once per URL) to the target's
        adaptive limits (errors slow it, successes bring it back); only targets that were
        degraded keep a health entry. The slowdown stretches the interval between starts;
        the scheduler's in-flight bound stays ``max_inflight_per_target``: a request in its
        timeout is no reason for the target's other requests to wait for it."""
        slot = self.slots.get(target)
        kept = slot is not None
        if slot is None:
            slot = TargetSlot(self.windows.get(target))  # kept only if it degrades
        had = slot.health is not None
        was = slot.slowdown
        wait = slot.observe(signal, retry_after_s, self.limits, url)
        if slot.health is not None and not had:
            if not kept:
                self.slots[target] = slot
            self._healths += 1
            self._health_room(adding=0)
            self._health_added()
        elif had and slot.health is None:
            self._healths -= 1
            if slot.empty:
                del self.slots[target]
        if slot.slowdown != was:
            self.sched.set_interval(target, self.interval(target))
        shed_to = slot.shed_to(signal, self.sched.queued(target), self.cap_of(target),
                               self.limits)
        return Observed(wait, shed_to)

    def defer(self, target: str, wait: float, now: float) -> bool:
        """No request to ``target`` for ``wait`` s; True if the rest is long enough that its
        queue should go to disk (it is refilled when :meth:`due_wakes` names it)."""
        self.sched.defer(target, now + wait)
        self._slot(target).rest(now + wait)
        self._rested.add(target)
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
        for target in [t for t in self._rested if self.slots[t].rest_over(now)]:
            self._rested.discard(target)
            if self.slots[target].empty:
                del self.slots[target]
        return len(self._rested)

    def window_wait(self, target: str, at: datetime) -> float:
        """Seconds until ``target``'s crawl window opens (0: open, or it has none), at most
        ``WINDOW_WAIT_CAP_S``: outside it, its jobs wait rather than go."""
        return self._view(target).window_wait(at)

    # --- memory share ---------------------------------------------------------------------

    def share(self, target: str) -> int:
        """Jobs ``target`` may hold in memory: a few seconds at its current rate."""
        return self._view(target).share(self.cap_of(target), self.limits)

    def held(self, target: str, queue: int) -> int:
        """A queue's jobs in memory (and the target's in flight): each queue (a tier's new
        URLs, its revisits) has its own share, so the scheduler's high:bulk mix and its
        revisit:new turns always see both."""
        return self.sched.queued(target, queue) + self.sched.inflight(target) \
            + self.identities.waiting(target)

    def must_park(self, target: str, queue: int, now: float, behind_parked: bool) -> bool:
        """Whether a new job goes to disk: behind what is parked, beyond the target's share,
        or no room for one more target's state (it comes back with a refill)."""
        return behind_parked \
            or self._view(target).over_share(self.held(target, queue), self.cap_of(target),
                                             self.limits) \
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
            self.robots.forget_target(target)
            self.identities.forget(target)
            h = self._forget_slot(target)
            if h is not None and h.degraded and idle_for < self.s.target_idle_s:
                self._rest_health(target, h, now - idle_for + self.s.target_idle_s)
        if forgotten:
            self.count("targets_forgotten", len(forgotten))

    def _forget_slot(self, target: str) -> TargetHealth | None:
        """Drop a forgotten target's slot (kept, holding only its rest, while it rests: the
        deferred_targets gauge drops it when the rest ends); returns its health."""
        slot = self.slots.get(target)
        if slot is None:
            return None
        if slot.robots_interval is not None:
            self._floors -= 1
        if slot.health is not None:
            self._healths -= 1
        h = slot.forget()
        if slot.empty:
            del self.slots[target]
        return h

    def _rest_health(self, target: str, h: TargetHealth, until: float) -> None:
        """Keep a forgotten degraded target's health until ``until``, within the bound
        (health of targets with a slot included): the oldest resting goes first."""
        self._health_room(adding=1)
        self.resting_health[target] = (until, h)
        self._health_added()

    def _health_room(self, adding: int) -> None:
        """Make room for ``adding`` more health entries (0: one was just added to a slot):
        the bound covers slots' and resting health, and slots' (of targets with a scheduler
        slot, at most ``max_target_state``) go before resting ones."""
        while self.resting_health and \
                self._healths + len(self.resting_health) + adding > self.s.max_target_state:
            del self.resting_health[next(iter(self.resting_health))]

    def _health_added(self) -> None:
        self.health_peak = max(self.health_peak, self._healths + len(self.resting_health))

    def memory_counts(self) -> dict[str, int]:
        """Sizes of the per-target state, each bounded by ``max_target_state``, and the
        largest each has been (``*_peak``, kept where entries are added): scheduler slots,
        robots.txt rules, targets with a robots.txt Crawl-delay / Request-rate remembered,
        and degraded targets' health (with a slot, or resting aside)."""
        return {"target_slots": self.sched.slot_count, "robots_rules": len(self.robots),
                "robots_intervals": self._floors,
                "target_health": self._healths + len(self.resting_health),
                "target_slots_peak": self.sched.slot_peak, "robots_rules_peak": self.robots.peak,
                "robots_intervals_peak": self.robots_interval_peak,
                "target_health_peak": self.health_peak, **self.identities.counts()}
