"""The fetch worker's partition-owned state, kept together: the dedupe store (restored from
``crawl.seen``) and the parked queues (restored from ``crawl.parked``). Both are restored
for a partition before it is used, advanced past each committed transaction, and dropped
with the partition."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Message, TopicPartition

from consumers.fetch.parking import ParkedQueues, encode_job
from consumers.fetch.seen import SeenStore
from core.config import Settings
from core.errors import DecodeError
from schemas.topics import Topology
from streams.io import Encoder, stable_committed
from streams.ledger import CommitBatch
from streams.membership import Membership

TP = tuple[str, int]
#: Expired dedupe keys are swept from the local store (a slice at a time) this often.
SWEEP_EVERY_S = 10.0


def parked_transform(enc: Encoder) -> Callable[[Message], bytes | None]:
    """Changelog record (Avro CrawlJob) → the parked store's bytes (compact JSON)."""
    def transform(msg: Message) -> bytes | None:
        try:
            return encode_job(enc.decode_job(msg))
        except DecodeError:
            return None
    return transform


class FetchStores:
    """The seen store and the parked queues of the partitions this worker owns."""

    def __init__(self, s: Settings, topo: Topology, enc: Encoder, seen: SeenStore,
                 parked: ParkedQueues, membership: Membership) -> None:
        self.s, self.topo, self.enc = s, topo, enc
        self.seen, self.parked, self.membership = seen, parked, membership
        self.sweep_at = 0.0

    def restore(self, parts: set[int]) -> tuple[set[int], Any]:
        """Restore thread: the seen and parked stores of ``parts``, and the group's committed
        offsets (read after any pending transactional ones settled, KIP-447)."""
        began = time.monotonic()
        for p in parts:  # a leftover DB (a cancelled restore) is reopened from its checkpoint
            self.seen.drop(p)
            self.parked.dropped(p)
            self.parked.store.drop(p)
        offsets = stable_committed(self.s, self.topo.group("fetch"), self.membership.expand(
            [TopicPartition(self.topo.frontier, p) for p in parts]))
        timeout = self.s.restore_timeout_s
        # The two stores restore side by side (their own DBs and changelog readers): opening
        # a new partition's RocksDB is most of a new crawl's restore, and it releases the GIL.
        with ThreadPoolExecutor(1, thread_name_prefix="parked-restore") as side:
            parked = side.submit(self.parked.store.restore, self.s, self.topo.parked,
                                 sorted(parts), parked_transform(self.enc), timeout)
            n, failed = self.seen.restore_partitions(self.s, self.topo.seen, sorted(parts),
                                                     self.enc.codec, timeout)
            parked_failed = parked.result()
        for p in failed - parked_failed:  # unused until both restore (then reopened)
            self.parked.store.drop(p)
        failed |= parked_failed
        targets = [t for p in sorted(parts - failed) for t in self.parked.restored(p)]
        return failed, (offsets, targets, n, time.monotonic() - began)

    def keep_only(self, owned: set[int]) -> None:
        """Drop the state of every partition not in ``owned``."""
        for part in self.seen.partitions() - owned:
            self.seen.drop(part)
        for part in self.parked.store.partitions() - owned:
            self.parked.dropped(part)
            self.parked.store.drop(part)

    def committed(self, batch: CommitBatch, written: dict[TP, int]) -> set[str]:
        """Apply a committed transaction's writes; each store's checkpoint moves past them.
        Returns the targets whose parked queue gained work."""
        self.seen.put_many(((p, k, *(v or (None, 0))) for (p, k), v in batch.seen.items()),
                           {p: o + 1 for (t, p), o in written.items() if t == self.topo.seen})
        gained = self.parked.committed(batch.changes)
        self.parked.store.advance({p: o + 1 for (t, p), o in written.items()
                                   if t == self.topo.parked})
        return gained

    def sweep_expired(self, now: float) -> int | None:
        """Expired dedupe keys give their disk back, a slice at a time: the keys swept, or
        None when no sweep is due (most polls)."""
        if now < self.sweep_at:
            return None
        self.sweep_at = now + SWEEP_EVERY_S
        return self.seen.sweep()

    def close(self) -> None:
        self.seen.close()
        self.parked.store.close()
