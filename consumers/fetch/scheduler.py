"""Per-target politeness scheduling: pure logic, driven by a monotonic clock.

Each target has FIFOs of jobs per priority tier (new URLs and revisits apart, below) and
the earliest time its next request may start. A target that is deferred (Retry-After,
back-off, robots unreachable) or held (paused, outside its crawl window) just gets a later
time; its jobs wait while every other target keeps flowing, so one slow site never blocks
a partition.

A target also has an in-flight limit: a released job counts against it until
:meth:`TargetScheduler.done`, so a slow site holds at most that many connections however
long it takes to answer.

Tiers share the target's cap: of every ``HIGH_SHARE + 1`` releases for a target with work
in both tiers, at most ``HIGH_SHARE`` go to the high tier, so the bulk tier keeps a
reserved share (80/20) and is never starved by a busy high tier.

Within a tier, revisits (jobs with ``visit`` > 0, put on the frontier by the revisit stage
when due) wait in a queue of their own beside new URLs, and the tier's releases alternate
between the two while both wait: new URLs keep half of the target's starts however many
revisits come due (100 due revisits delay 10 new URLs by 10 starts, not 100), and revisits
keep half however many links a site mints (a site that never stops growing still gets
refreshed). Alternation was chosen over a weighted share because neither kind of work is
more urgent in general, it needs one bit of state per tier, and it is exact from the first
release; a queue alone gets every start, so a target with only revisits or only new URLs
runs at its full cap. Both queues share the target's interval, in-flight limit and holds:
politeness is the target's, whatever kind of job goes. A revisit queue's deque is made
only while it holds a job (a worker may hold 10,000 slots), and the parked store keeps the
same four queues on disk (:mod:`consumers.fetch.parking`), so a backlog of due revisits
parked on disk never holds a new URL behind it either. Each queue has its own memory share
(:meth:`TargetPolicy.held`), as each tier had: a target with both kinds waiting may hold
twice the jobs in memory it held before, and no more.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
BULK, HIGH = 0, 1
HIGH_SHARE = 4  # high:bulk = 4:1 when both tiers have work
#: Added to a tier: that tier's revisit queue. A queue number is ``tier | REVISIT`` or the
#: tier alone (new URLs): BULK 0, HIGH 1, bulk revisits 2, high revisits 3.
REVISIT = 2
#: Every queue number, high tier first.
QUEUES = (HIGH, HIGH | REVISIT, BULK, BULK | REVISIT)


def queue_of(tier: int, revisit: bool) -> int:
    """The queue number of a job of priority ``tier`` (> 0: high), a revisit or not."""
    return (HIGH if tier > 0 else BULK) | (REVISIT if revisit else 0)


@dataclass
class _Slot(Generic[T]):
    interval: float
    #: Indexed by queue number; a revisit queue exists only while it holds jobs.
    queues: list[deque[T] | None] = field(default_factory=lambda: [deque(), deque(), None, None])
    next_at: float = 0.0
    scheduled: bool = False  # present in the ready heap
    high_run: int = 0  # consecutive high-tier releases while bulk work waited
    revisit_next: int = 0  # bit ``tier`` set: that tier's revisit queue goes next
    inflight: int = 0  # released, not yet done
    limit: int = 1 << 30  # in-flight limit
    last_sent: float = float("-inf")  # when this worker's last request to it left

    def __len__(self) -> int:
        q = self.queues
        return len(q[0] or ()) + len(q[1] or ()) + len(q[2] or ()) + len(q[3] or ())

    def count(self, queue: int) -> int:
        q = self.queues[queue]
        return len(q) if q else 0

    def queue(self, queue: int) -> deque[T]:
        """Queue ``queue``, made if it is a revisit queue holding nothing: its first job
        goes next (the tier's last release was a new URL's, or none)."""
        q = self.queues[queue]
        if q is None:
            q = self.queues[queue] = deque()
            self._turn(queue & HIGH, True)
        return q

    def put(self, queue: int, job: T, front: bool = False) -> None:
        if front:
            self.queue(queue).appendleft(job)
            self._turn(queue & HIGH, bool(queue & REVISIT))  # it was next: it still is
        else:
            self.queue(queue).append(job)

    def _turn(self, tier: int, revisit: bool) -> None:
        if revisit:
            self.revisit_next |= 1 << tier
        else:
            self.revisit_next &= ~(1 << tier)

    def tier_count(self, tier: int) -> int:
        return self.count(tier) + self.count(tier | REVISIT)

    def take_next(self) -> T:
        q = self.queues
        if q[BULK | REVISIT] is None and q[HIGH | REVISIT] is None:  # no revisit waits
            high_q, bulk_q = q[HIGH], q[BULK]
            assert high_q is not None and bulk_q is not None
            if high_q and (not bulk_q or self.high_run < HIGH_SHARE):
                self.high_run = self.high_run + 1 if bulk_q else 0
                return high_q.popleft()
            self.high_run = 0
            return bulk_q.popleft()
        high, bulk = self.tier_count(HIGH), self.tier_count(BULK)
        if high and (not bulk or self.high_run < HIGH_SHARE):
            self.high_run = self.high_run + 1 if bulk else 0
            return self._take_from(HIGH)
        self.high_run = 0
        return self._take_from(BULK)

    def _take_from(self, tier: int) -> T:
        """The tier's next job: revisits and new URLs in turn while both wait."""
        new, old = self.queues[tier], self.queues[tier | REVISIT]
        revisit = bool(old) and (not new or bool(self.revisit_next >> tier & 1))
        self._turn(tier, not revisit)  # the other queue goes next
        if not revisit:
            assert new is not None
            return new.popleft()
        assert old is not None
        job = old.popleft()
        if not old:
            self.queues[tier | REVISIT] = None
        return job

    def clear(self) -> None:
        self.queues = [deque(), deque(), None, None]


class TargetScheduler(Generic[T]):
    """Releases at most one job per target per interval (1 / cap, or the Crawl-delay)."""

    def __init__(self, interval_for: Callable[[str], float],
                 limit: int = 1 << 30,
                 taken_over_at: Callable[[str], float] | None = None) -> None:
        self._interval_for = interval_for
        #: When this worker took ``target`` over from an owner that may have sent to it a
        #: moment before (-inf: never): its first request here waits an interval past it.
        self._taken_over_at = taken_over_at
        self._limit = limit  # default in-flight limit of a new target
        self._slots: dict[str, _Slot[T]] = {}
        self._heap: list[tuple[float, str]] = []
        self._size = 0
        self._held: set[str] = set()
        self.slot_peak = 0  # the most slots held at once (high-water mark)

    def __len__(self) -> int:
        return self._size

    def __contains__(self, target: object) -> bool:
        """Whether ``target`` has a slot (state kept for it)."""
        return target in self._slots

    def _slot(self, target: str, now: float) -> _Slot[T]:
        slot = self._slots.get(target)
        if slot is None:
            slot = self._slots[target] = _Slot(self._interval_for(target), next_at=now,
                                               limit=self._limit)
            if self._taken_over_at is not None:
                slot.last_sent = self._taken_over_at(target)
            self.slot_peak = max(self.slot_peak, len(self._slots))
        return slot

    def _schedule(self, target: str, slot: _Slot[T], now: float) -> None:
        if not slot.scheduled and target not in self._held and len(slot) \
                and slot.inflight < slot.limit:
            slot.scheduled = True
            heapq.heappush(self._heap, (max(slot.next_at, now), target))

    def push(self, target: str, job: T, now: float, tier: int = BULK,
             revisit: bool = False) -> None:
        """Queue ``job`` (of priority ``tier``, a revisit or a new URL) for ``target``."""
        slot = self._slot(target, now)
        slot.put(queue_of(tier, revisit), job)
        self._size += 1
        self._schedule(target, slot, now)

    def push_front(self, target: str, job: T, now: float, tier: int = BULK,
                   revisit: bool = False) -> None:
        """Put ``job`` back at the head of its queue (it was released too early)."""
        slot = self._slot(target, now)
        slot.put(queue_of(tier, revisit), job, front=True)
        self._size += 1
        self._schedule(target, slot, now)

    def set_interval(self, target: str, interval: float) -> None:
        slot = self._slots.get(target)
        if slot is not None:
            slot.interval = interval

    def defer(self, target: str, until: float) -> None:
        """No request to ``target`` before monotonic time ``until`` (never earlier)."""
        slot = self._slots.get(target)
        if slot is None:
            slot = self._slots[target] = _Slot(self._interval_for(target), limit=self._limit)
            self.slot_peak = max(self.slot_peak, len(self._slots))
        if until > slot.next_at:
            slot.next_at = until
            if slot.scheduled:  # re-key lazily: stale heap entries are skipped in pop
                heapq.heappush(self._heap, (until, target))

    def deferred_for(self, target: str, now: float) -> float:
        slot = self._slots.get(target)
        return max(0.0, slot.next_at - now) if slot is not None else 0.0

    def pop_ready(self, now: float, limit: int) -> list[tuple[str, T]]:
        """Jobs whose target may be hit now, one per target, at most ``limit``."""
        out: list[tuple[str, T]] = []
        while self._heap and len(out) < limit and self._heap[0][0] <= now:
            at, target = heapq.heappop(self._heap)
            slot = self._slots.get(target)
            if slot is None or not slot.scheduled or at < slot.next_at:
                continue  # stale entry, a later one exists
            slot.scheduled = False
            if not len(slot) or target in self._held or slot.inflight >= slot.limit:
                continue
            out.append((target, slot.take_next()))
            self._size -= 1
            slot.inflight += 1
            slot.next_at = max(now, slot.next_at) + slot.interval
            self._schedule(target, slot, now)
        return out

    def refund(self, target: str, now: float) -> None:
        """Give back the slot of a release that sent no request (e.g. robots-disallowed)."""
        slot = self._slots.get(target)
        if slot is None:
            return
        slot.next_at = max(now, slot.next_at - slot.interval)
        if len(slot) and target not in self._held and slot.inflight < slot.limit:
            slot.scheduled = True
            heapq.heappush(self._heap, (slot.next_at, target))

    def done(self, target: str, now: float) -> None:
        """A released job of ``target`` finished (or sent nothing): free its in-flight slot."""
        slot = self._slots.get(target)
        if slot is not None and slot.inflight > 0:
            slot.inflight -= 1
            self._schedule(target, slot, now)

    def set_limit(self, target: str, limit: int, now: float) -> None:
        """In-flight limit of ``target`` (at least 1); jobs already in flight finish."""
        slot = self._slot(target, now)
        slot.limit = max(1, limit)
        self._schedule(target, slot, now)

    def inflight(self, target: str) -> int:
        slot = self._slots.get(target)
        return slot.inflight if slot else 0

    def take_tail(self, target: str, keep: int) -> list[T]:
        """Remove and return the newest jobs of ``target`` beyond its first ``keep`` queued
        (bulk tier first, its revisits before its new URLs): what a target holds beyond its
        memory share goes back to disk."""
        slot = self._slots.get(target)
        if slot is None:
            return []
        out: list[T] = []
        excess = len(slot) - max(0, keep)
        for queue in reversed(QUEUES):
            q = slot.queues[queue]
            while excess > 0 and q:
                out.append(q.pop())
                excess -= 1
            if queue & REVISIT and not q:
                slot.queues[queue] = None
        self._size -= len(out)
        out.reverse()
        return out

    def hold(self, target: str) -> None:
        """Release nothing for ``target`` until :meth:`release` (a paused target)."""
        self._held.add(target)

    def release(self, target: str, now: float) -> None:
        self._held.discard(target)
        slot = self._slots.get(target)
        if slot is not None:
            self._schedule(target, slot, now)

    def targets(self) -> list[str]:
        return list(self._slots)

    def reserve_send(self, target: str, now: float) -> float:
        """When a released job's request to ``target`` may leave, so that two requests
        leave at least an interval apart, reserved: the next caller's time is an interval
        later even while this one still waits for its own (two requests released close
        together, both waiting out a takeover's interval, would otherwise leave at once).
        Releases are spaced by the interval already; a request can still leave late (an
        event loop busy with a restore, a collection) and the next on time, and the site
        counts the gap it sees."""
        slot = self._slots.get(target)
        if slot is None:
            return now
        at = max(now, slot.last_sent + slot.interval)
        slot.last_sent = at
        return at

    def sent(self, target: str, now: float) -> None:
        """A request to ``target`` leaves now."""
        slot = self._slots.get(target)
        if slot is not None:
            slot.last_sent = max(slot.last_sent, now)

    def handover(self, taken: Callable[[str], bool], now: float) -> None:
        """The targets ``taken`` over just now (their partitions came from another owner,
        or from this worker's earlier life) send no sooner than an interval from now: the
        former owner's last request may have left a moment ago, and the site counts both."""
        for target, slot in self._slots.items():
            if taken(target):
                slot.last_sent = max(slot.last_sent, now)

    def evict_idle(self, now: float, idle_s: float, keep: int) -> list[tuple[str, float]]:
        """Forget targets with nothing queued, nothing in flight, not held, whose next
        request is allowed now (so forgetting loosens no cap): every one idle for ``idle_s``
        and, while more than ``keep`` slots remain, the longest idle of the rest. A target
        seen again starts a fresh slot. Returns (target, seconds idle) of those forgotten."""
        idle = sorted((slot.next_at, target) for target, slot in self._slots.items()
                      if not len(slot) and not slot.inflight and not slot.scheduled
                      and target not in self._held and slot.next_at <= now)
        over = len(self._slots) - keep
        out = [(t, now - at) for n, (at, t) in enumerate(idle) if n < over or now - at >= idle_s]
        for target, _ in out:
            del self._slots[target]
        return out

    @property
    def slot_count(self) -> int:
        return len(self._slots)

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def take(self, target: str) -> list[T]:
        """Remove and return every job queued for ``target`` (to spill it elsewhere)."""
        slot = self._slots.get(target)
        if slot is None:
            return []
        jobs = [job for queue in QUEUES for job in slot.queues[queue] or ()]
        slot.clear()
        self._size -= len(jobs)
        return jobs

    def drop(self, keep: Callable[[T], bool]) -> int:
        """Remove queued jobs for which ``keep`` is false (e.g. revoked partitions)."""
        dropped = 0
        for slot in self._slots.values():
            for n, q in enumerate(slot.queues):
                if not q:
                    continue
                before = len(q)
                kept = [j for j in q if keep(j)]
                q.clear()
                q.extend(kept)
                dropped += before - len(kept)
                if n & REVISIT and not q:
                    slot.queues[n] = None
        self._size -= dropped
        return dropped

    def queued(self, target: str, queue: int | None = None) -> int:
        """Jobs queued for ``target`` (in one queue, by its number, or all of them)."""
        slot = self._slots.get(target)
        if slot is None:
            return 0
        return len(slot) if queue is None else slot.count(queue)
