"""Per-target politeness scheduling: pure logic, driven by a monotonic clock.

Each target has a FIFO of jobs and the earliest time its next request may start. A target
that is deferred (Retry-After, back-off, robots unreachable) just gets a later time; its
jobs wait while every other target keeps flowing, so one slow site never blocks a partition.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Slot(Generic[T]):
    interval: float
    queue: deque[T] = field(default_factory=deque)
    next_at: float = 0.0
    scheduled: bool = False  # present in the ready heap


class TargetScheduler(Generic[T]):
    """Releases at most one job per target per interval (1 / cap, or the Crawl-delay)."""

    def __init__(self, interval_for: Callable[[str], float]) -> None:
        self._interval_for = interval_for
        self._slots: dict[str, _Slot[T]] = {}
        self._heap: list[tuple[float, str]] = []
        self._size = 0
        self._held: set[str] = set()

    def __len__(self) -> int:
        return self._size

    def push(self, target: str, job: T, now: float) -> None:
        slot = self._slots.get(target)
        if slot is None:
            slot = self._slots[target] = _Slot(self._interval_for(target), next_at=now)
        slot.queue.append(job)
        self._size += 1
        if not slot.scheduled and target not in self._held:
            slot.scheduled = True
            heapq.heappush(self._heap, (max(slot.next_at, now), target))

    def push_front(self, target: str, job: T, now: float) -> None:
        """Put ``job`` back at the head of its target's queue (it was released too early)."""
        self.push(target, job, now)
        slot = self._slots[target]
        slot.queue.rotate(1)

    def set_interval(self, target: str, interval: float) -> None:
        slot = self._slots.get(target)
        if slot is not None:
            slot.interval = interval

    def defer(self, target: str, until: float) -> None:
        """No request to ``target`` before monotonic time ``until`` (never earlier)."""
        slot = self._slots.get(target)
        if slot is None:
            slot = self._slots[target] = _Slot(self._interval_for(target))
        if until > slot.next_at:
            slot.next_at = until
            if slot.scheduled:  # re-key lazily: stale heap entries are skipped in pop
                heapq.heappush(self._heap, (until, target))

    def pop_ready(self, now: float, limit: int) -> list[tuple[str, T]]:
        """Jobs whose target may be hit now, one per target, at most ``limit``."""
        out: list[tuple[str, T]] = []
        while self._heap and len(out) < limit and self._heap[0][0] <= now:
            at, target = heapq.heappop(self._heap)
            slot = self._slots[target]
            if not slot.scheduled or at < slot.next_at:
                continue  # stale entry, a later one exists
            slot.scheduled = False
            if not slot.queue or target in self._held:
                continue
            out.append((target, slot.queue.popleft()))
            self._size -= 1
            slot.next_at = max(now, slot.next_at) + slot.interval
            if slot.queue:
                slot.scheduled = True
                heapq.heappush(self._heap, (slot.next_at, target))
        return out

    def hold(self, target: str) -> None:
        """Release nothing for ``target`` until :meth:`release` (a paused target)."""
        self._held.add(target)

    def release(self, target: str, now: float) -> None:
        self._held.discard(target)
        slot = self._slots.get(target)
        if slot is not None and slot.queue and not slot.scheduled:
            slot.scheduled = True
            heapq.heappush(self._heap, (max(slot.next_at, now), target))

    def targets(self) -> list[str]:
        return list(self._slots)

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def drop(self, keep: Callable[[T], bool]) -> int:
        """Remove queued jobs for which ``keep`` is false (e.g. revoked partitions)."""
        dropped = 0
        for slot in self._slots.values():
            before = len(slot.queue)
            slot.queue = deque(j for j in slot.queue if keep(j))
            dropped += before - len(slot.queue)
        self._size -= dropped
        return dropped

    def queued(self, target: str) -> int:
        slot = self._slots.get(target)
        return len(slot.queue) if slot else 0
