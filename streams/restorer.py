"""Restores of partition-owned state off the poll thread: complete, or the partition waits.

A stage that owns state per partition (the fetch stage's dedupe and parked stores, the retry
stage's timers) must not use a partition before its store holds the committed state. The
rebalance callback only pauses the new partitions and calls :meth:`Restorer.start`; the
restore runs on this class's own thread, so the poll thread keeps serving the partitions it
already owns (and keeps heart-beating). The poll thread collects finished restores with
:meth:`Restorer.finished` and resumes only partitions whose restore completed. A partition
revoked meanwhile is cancelled: its result, when it comes, is discarded. A restore that did
not complete is retried after :data:`RETRY_S`; until then the partition stays paused and
counts in :attr:`Restorer.failing`, which the stage reports (log, status gauge).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("crawlfleet.restore")

#: A restore that did not complete is tried again this long after it gave up.
RETRY_S = 10.0

#: Restores ``parts`` and returns (parts it could not complete, anything for the stage).
RestoreFn = Callable[[set[int]], tuple[set[int], Any]]


@dataclass
class Restored:
    """A finished restore: the partitions now usable, those that failed, the stage's data."""

    complete: set[int]
    failed: set[int]
    payload: Any
    seconds: float
    error: str = ""


@dataclass
class _Job:
    parts: set[int]
    tokens: dict[int, int]
    future: Future[tuple[set[int], Any]]
    started: float = field(default_factory=time.monotonic)


class Restorer:
    """Runs restores one at a time on a thread of their own; tracks which partitions wait."""

    def __init__(self, name: str, restore: RestoreFn, retry_s: float = RETRY_S) -> None:
        self.name = name
        self._restore = restore
        self._retry_s = retry_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-restore")
        self._lock = threading.Lock()
        self._tokens: dict[int, int] = {}  # bumped by every start and cancel of a partition
        self._waiting: set[int] = set()  # started, not yet usable (running or failed)
        self._jobs: list[_Job] = []
        self._retry: dict[int, float] = {}  # failed partition -> when to try again

    @property
    def waiting(self) -> set[int]:
        """Partitions assigned but not usable yet: paused until their restore completes."""
        with self._lock:
            return set(self._waiting)

    def running(self) -> bool:
        """True while a restore runs: a partition waits that is not waiting for a retry
        (asked on every poll of the runtime, so no set is copied)."""
        with self._lock:
            return not self._waiting <= self._retry.keys()

    @property
    def failing(self) -> set[int]:
        """Partitions whose last restore did not complete (they wait for a retry)."""
        with self._lock:
            return set(self._retry)

    def start(self, parts: Iterable[int]) -> None:
        """Restore ``parts`` (newly assigned) in the background."""
        todo = set(parts)
        if not todo:
            return
        with self._lock:
            for p in todo:
                self._tokens[p] = self._tokens.get(p, 0) + 1
                self._retry.pop(p, None)
            self._waiting |= todo
            self._submit(todo)

    def cancel(self, parts: Iterable[int]) -> None:
        """``parts`` were revoked: whatever their restore returns is discarded."""
        with self._lock:
            for p in parts:
                if p in self._waiting:
                    self._tokens[p] = self._tokens.get(p, 0) + 1
                    self._waiting.discard(p)
                    self._retry.pop(p, None)

    def _submit(self, parts: set[int]) -> None:
        tokens = {p: self._tokens[p] for p in parts}
        future = self._pool.submit(self._restore, set(parts))
        self._jobs.append(_Job(set(parts), tokens, future))

    def finished(self, now: float | None = None) -> list[Restored]:
        """Restores done since the last call (only partitions still waiting for them);
        failed partitions whose retry is due are started again."""
        now = time.monotonic() if now is None else now
        out: list[Restored] = []
        with self._lock:
            running: list[_Job] = []
            for job in self._jobs:
                if not job.future.done():
                    running.append(job)
                    continue
                live = {p for p in job.parts if self._tokens.get(p) == job.tokens[p]}
                error = ""
                try:
                    failed, payload = job.future.result()
                except Exception as exc:  # a restore must never take the stage down
                    log.exception("%s restore of partitions %s failed", self.name,
                                  sorted(job.parts))
                    failed, payload, error = set(job.parts), None, f"{type(exc).__name__}: {exc}"
                failed = failed & live
                complete = live - failed
                self._waiting -= complete
                for p in failed:
                    self._retry[p] = now + self._retry_s
                if live:
                    out.append(Restored(complete, failed, payload, now - job.started, error))
            self._jobs = running
            due = {p for p, t in self._retry.items() if t <= now}
            for p in due:
                del self._retry[p]
            if due:
                self._submit(due)
        return out

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def close(self) -> None:
        """Wait for a running restore to end (it writes to stores the stage closes next)."""
        with self._lock:
            for job in self._jobs:
                job.future.cancel()
        self._pool.shutdown(wait=True)
