"""Slow start for transactions: how much work the next commit may wait to cover.

A stage that commits big transactions is cheap under load (fewer commits for the broker),
but after a quiet spell a burst (the next level of a crawl arriving at once) would then
reach the next stage only when all of it is done. So, as in TCP's slow start, the cap on a
transaction starts small and doubles with each committed one; under sustained load it stays
above what a transaction holds and changes nothing. Pure logic, no broker.
"""

from __future__ import annotations

import time
from collections import deque


class SlowStart:
    def __init__(self, floor: int = 50, window_s: float = 1.0) -> None:
        self.floor = floor
        self.window_s = window_s
        self._recent: deque[tuple[float, int]] = deque()  # (when, size) of commits

    def cap(self, now: float | None = None) -> int:
        """Twice the largest commit of the last ``window_s``, and at least ``floor``."""
        now = time.monotonic() if now is None else now
        while self._recent and now - self._recent[0][0] > self.window_s:
            self._recent.popleft()
        return max(self.floor, 2 * max((n for _, n in self._recent), default=0))

    def committed(self, size: int, now: float | None = None) -> None:
        """Record a committed transaction of ``size`` (records or outputs)."""
        if size > 0:
            self._recent.append((time.monotonic() if now is None else now, size))
