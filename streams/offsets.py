"""Which input offset is safe to commit when records complete out of order."""

from __future__ import annotations

import heapq


class OffsetTracker:
    """Per-partition bookkeeping: commit only below the oldest record still in flight.

    Records finish in any order (fetches to different targets take different times); the
    committed offset must never pass a record whose work is not done, or a crash would lose
    it. Records done beyond that point are committed later, and if redelivered first, their
    dedupe keys (written in the same transaction) suppress the repeat.
    """

    def __init__(self, committed: int | None = None) -> None:
        """``committed``: the group's committed offset when the partition was assigned
        (None if it has none), so work that consumed no record can still commit."""
        self._inflight: list[int] = []  # min-heap of offsets started, not yet done
        self._done: set[int] = set()  # done offsets still in the heap (lazy deletion)
        self._next: int | None = committed  # one past the highest offset seen
        self._committed: int | None = committed

    def start(self, offset: int) -> None:
        heapq.heappush(self._inflight, offset)
        if self._next is None or offset >= self._next:
            self._next = offset + 1

    def done(self, offset: int) -> None:
        self._done.add(offset)
        while self._inflight and self._inflight[0] in self._done:
            self._done.discard(heapq.heappop(self._inflight))

    def advance_to(self, position: int) -> None:
        """Consumer position past transaction markers: safe when nothing is in flight."""
        if self.in_flight == 0 and (self._next is None or position > self._next):
            self._next = position

    @property
    def in_flight(self) -> int:
        return len(self._inflight) - len(self._done)

    def commit_point(self) -> int | None:
        """Offset to commit (next to read), or None if nothing new is safe to commit."""
        point = self._inflight[0] if self._inflight else self._next
        if point is None or point == self._committed:
            return None
        return point

    def safe_point(self) -> int:
        """Offset safe to commit now, even if unchanged.

        Sent with every transaction that carries outputs from this partition, so the
        broker checks this worker still owns it (a transaction without offsets is not
        checked against the group, and a zombie's outputs would be committed). A partition
        the group never committed and this worker has read nothing of is at 0, which is
        where the group reads it from anyway (``auto.offset.reset=earliest``): its results
        (parked jobs of a target whose records all came on the other tier) must commit too,
        and used to wait for a record that might never come.
        """
        if self._inflight:
            return self._inflight[0]
        return self._next if self._next is not None else 0

    def committed(self, offset: int) -> None:
        self._committed = offset
