"""Parked per-target queues: work beyond a target's memory share, on disk, in order.

A fetch worker keeps in memory only a target's *share* (a few seconds of work at its current
rate plus a small floor); a frontier record beyond it is *parked*: written to the compacted
``crawl.parked`` changelog in the transaction that commits its frontier offset, and applied
to the partition-owned :class:`StateStore` once that commits (BUbiNG's per-host
"virtualizer", as a Kafka Streams state store). When the target has room again, its parked
jobs come back in order; a job's completion tombstones its parked entry in the transaction
that commits its results. A crash in between redoes the job, and the dedupe keys suppress
a second side effect.

Keys are ``target NUL queue offset``, one queue per scheduler queue
(:data:`consumers.fetch.scheduler.QUEUES`: a tier's new URLs, the tier's revisits): the high
tier's new URLs sort first, and within a queue the frontier offset keeps publication order,
also for jobs that go back to disk again (a target deferred for long sheds its queue here,
and its jobs slot back in where they were). Revisits are parked apart from new URLs so that
a due backlog of one never holds the other behind it on disk; the bytes of the two new-URL
queues are those the keys had before revisits had queues of their own, so a store parked
then reads the same.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from consumers.fetch.scheduler import HIGH, QUEUES, REVISIT
from schemas.records import CrawlJob
from schemas.topics import partition_for
from streams.ledger import StoreChange
from streams.state_store import StateStore

HIGH_BYTE, BULK_BYTE = b"\x00", b"\x01"  # new URLs; revisits: the same plus 2
P = ParamSpec("P")
Q = tuple[str, int]  # one parked queue: (target, queue number)
R = TypeVar("R")


def park_key(target: str, queue: int, offset: int) -> bytes:
    """The key of a job parked in ``target``'s queue number ``queue`` at ``offset``."""
    return _prefix(target, queue) + offset.to_bytes(8, "big")


def target_of_key(key: bytes) -> str:
    return key[:key.index(b"\x00")].decode()


def queue_of_key(key: bytes) -> tuple[str, int]:
    """(target, queue number) of a parked key."""
    cut = key.index(b"\x00")
    byte = key[cut + 1]
    return key[:cut].decode(), (HIGH if byte % 2 == 0 else 0) | (REVISIT if byte >= 2 else 0)


def _prefix(target: str, queue: int) -> bytes:
    byte = (0 if queue & HIGH else 1) + (2 if queue & REVISIT else 0)
    return target.encode() + b"\x00" + bytes((byte,))


def encode_job(job: CrawlJob) -> bytes:
    return json.dumps(job, separators=(",", ":")).encode()


def decode_job(raw: bytes) -> CrawlJob:
    """A stored job: JSON of a CrawlJob the changelog's codec read (see encode_job)."""
    job: CrawlJob = json.loads(raw)
    return job


def share_of(rate: float, horizon_s: float, floor: int, inflight_limit: int,
             ceiling: int) -> int:
    """Jobs a target may hold in memory: ``horizon_s`` of work at ``rate`` requests/s plus
    what may be in flight and a floor, never more than ``ceiling``."""
    work = rate * horizon_s if math.isfinite(rate) else float(ceiling)
    return max(1, min(ceiling, floor + inflight_limit + math.ceil(min(work, ceiling))))


def _locked(fn: Callable[P, R]) -> Callable[P, R]:
    """Counts change on the event loop (park, take) and on Kafka's thread (commits,
    rebalances): every public method holds the instance's lock."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with args[0]._lock:  # type: ignore[attr-defined]
            return fn(*args, **kwargs)
    return wrapper


class ParkedQueues:
    """Counts and moves of the parked jobs of the partitions this worker owns.

    Each (target, queue number) is one queue. ``stored`` counts its committed entries; ``taken`` are
    entries back in memory (not yet tombstoned by a committed transaction); ``pending``
    counts parks not yet committed. A queue with parked work takes new arrivals behind it
    (parks them too), so order is kept; tiers, and revisits and new URLs, are separate
    queues, so the scheduler's high:bulk mix and its revisit:new turns still see both.
    """

    def __init__(self, store: StateStore, partitions: int) -> None:
        self.store = store
        self.partitions = partitions
        self._stored: dict[Q, int] = {}
        self._taken: set[bytes] = set()
        self._taken_n: dict[Q, int] = {}
        self._pending: dict[Q, int] = {}
        self._lock = threading.RLock()
        # Entries per partition, committed or pending (the backlog reported to the fleet),
        # and the partitions whose count changed since :meth:`backlog_changes` last asked.
        self._per_part: dict[int, int] = {}
        self._changed: set[int] = set()

    # --- counts ---------------------------------------------------------------------------

    @_locked
    def available(self, target: str, queue: int | None = None) -> int:
        """Committed entries not in memory (of one queue, or all): what a refill can take."""
        queues = QUEUES if queue is None else (queue,)
        return sum(self._stored.get((target, q), 0) - self._taken_n.get((target, q), 0)
                   for q in queues)

    @_locked
    def waiting_targets(self) -> set[str]:
        """Targets with committed entries not in memory (a refill could take them)."""
        return {t for (t, queue), n in self._stored.items()
                if n - self._taken_n.get((t, queue), 0) > 0}

    @_locked
    def must_park(self, target: str, queue: int) -> bool:
        """New work goes behind what its queue has parked, or order would be lost."""
        return self.available(target, queue) > 0 or self._pending.get((target, queue), 0) > 0

    @_locked
    def total(self) -> int:
        """Jobs parked (committed or not) and not in memory: for the ``parked`` gauge."""
        return sum(self._stored.values()) - len(self._taken) + sum(self._pending.values())

    @_locked
    def backlog_changes(self) -> dict[int, int]:
        """Parked entries of each partition whose count changed since the last call."""
        out = {p: self._per_part.get(p, 0) for p in self._changed}
        self._changed.clear()
        return out

    def _count(self, partition: int, delta: int) -> None:
        self._per_part[partition] = self._per_part.get(partition, 0) + delta
        self._changed.add(partition)

    @staticmethod
    def _add(counts: dict[Q, int], q: Q, delta: int) -> None:
        n = counts.get(q, 0) + delta
        if n > 0:
            counts[q] = n
        else:
            counts.pop(q, None)

    # --- partitions -----------------------------------------------------------------------

    @_locked
    def restored(self, partition: int) -> list[str]:
        """Count a freshly restored partition's entries; returns its targets with work."""
        n, targets = 0, set()
        for key, _ in self.store.scan(partition):
            q = queue_of_key(key)
            self._add(self._stored, q, 1)
            targets.add(q[0])
            n += 1
        self._count(partition, n)
        return list(targets)

    @_locked
    def dropped(self, partition: int) -> None:
        """Forget a revoked partition's counts (its store is closed by the caller)."""
        def gone(q: Q) -> bool:
            return partition_for(q[0], self.partitions) == partition
        for counts in (self._stored, self._taken_n, self._pending):
            for q in [q for q in counts if gone(q)]:
                del counts[q]
        self._taken = {k for k in self._taken if not gone(queue_of_key(k))}
        self._per_part.pop(partition, None)
        self._changed.discard(partition)  # its next owner reports it

    # --- moves ----------------------------------------------------------------------------

    @_locked
    def park(self, partition: int, key: bytes, job: CrawlJob) -> StoreChange:
        """A job goes to disk: the change to commit (and apply once committed)."""
        self._add(self._pending, queue_of_key(key), 1)
        self._count(partition, 1)
        return partition, key, encode_job(job)

    @_locked
    def take(self, partition: int, target: str, queue: int,
             n: int) -> list[tuple[bytes, CrawlJob]]:
        """Up to ``n`` of the queue's oldest parked jobs back into memory."""
        if n <= 0 or self.available(target, queue) <= 0:
            return []
        out = self._scan(partition, _prefix(target, queue), n)
        for key, _ in out:
            self._taken.add(key)
            self._add(self._taken_n, (target, queue), 1)
        return [(k, decode_job(v)) for k, v in out]

    def _scan(self, partition: int, prefix: bytes, n: int) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        start: bytes | None = None
        while len(out) < n:
            batch = self.store.scan(partition, prefix, limit=n + 16, start=start)
            out += [(k, v) for k, v in batch if k not in self._taken][:n - len(out)]
            if len(batch) < n + 16:
                break
            start = batch[-1][0] + b"\x00"  # the next key after the last one scanned
        return out

    @_locked
    def untake(self, key: bytes) -> None:
        """A taken job goes back to disk unchanged (its entry is still in the store)."""
        if key in self._taken:
            self._taken.discard(key)
            self._add(self._taken_n, queue_of_key(key), -1)

    @_locked
    def committed(self, changes: Iterable[StoreChange]) -> set[str]:
        """Apply committed changes to the store; returns the targets that gained work."""
        by_part: dict[int, list[tuple[bytes, bytes | None]]] = {}
        gained: set[str] = set()
        staged: dict[bytes, bool] = {}
        owned = self.store.partitions()
        for partition, key, value in changes:
            if partition not in owned:
                continue  # revoked meanwhile: the next owner restores it from the changelog
            by_part.setdefault(partition, []).append((key, value))
            q = queue_of_key(key)
            # A replayed frontier record parks again under the same key: count entries,
            # not writes (what the store holds, with this batch's earlier changes).
            there = staged.get(key, self.store.get(partition, key) is not None)
            staged[key] = value is not None
            if value is None:  # done: the entry leaves the store and memory
                if there:
                    self._add(self._stored, q, -1)
                    self._count(partition, -1)
                if key in self._taken:
                    self._taken.discard(key)
                    self._add(self._taken_n, q, -1)
            else:
                self._add(self._pending, q, -1)
                if there:
                    self._count(partition, -1)  # park() counted it as new
                else:
                    self._add(self._stored, q, 1)
                gained.add(q[0])
        for partition, items in by_part.items():
            self.store.apply(partition, items)
        return gained

    @_locked
    def aborted(self, changes: Iterable[StoreChange]) -> None:
        """The parks never committed: they are redone from the frontier."""
        for partition, key, value in changes:
            if value is not None:
                if partition in self._per_part:
                    self._count(partition, -1)
                self._add(self._pending, queue_of_key(key), -1)
