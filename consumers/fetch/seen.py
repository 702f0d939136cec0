"""Dedupe state per owned partition: a local RocksDB restored from the ``crawl.seen`` changelog.

The fetch stage owns a target's frontier partition and the same-numbered ``crawl.seen``
partition; it writes every state change to ``crawl.seen`` inside the transaction that commits
the work, and applies the change here (``put_many``) only after that transaction committed, so
this store is never ahead of committed state.

The store is a :class:`streams.state_store.StateStore`, which explains the mechanics: one
RocksDB per partition under ``<directory>/p<N>``, a *checkpoint* (next changelog offset to
read) written in the same write batch as the records up to it, a restore from the checkpoint
to the changelog's high watermark (not the last stable offset) with a ``read_committed``
consumer, WAL-less writes because the changelog is the log, and the wipe and rebuild of a
partition whose checkpoint is off the log (so keys that left the topic also leave the store).
``put_many`` moves the checkpoint past its writes in the same batch as them. What is the
dedupe store's own is here: its values, its RocksDB tuning and its restore transform.

Keys are the UTF-8 bytes of ``profile|canonical-URL`` (never starting with NUL: the store's
reserved keys, which it refuses to write); values are the compact :func:`encode_value` bytes
(1 state byte + a zigzag varint attempt + the write time), never Avro. The write time is the
TTL's: ``crawl.seen`` forgets a key after its retention, so the store does too (a read hides
it, ``sweep`` deletes it, a restore drops a record older than the TTL by its timestamp).

Memory does not grow with the key count: the store is declared with the runtime's ``large``
tuning (:mod:`streams.store_open`: a bounded block cache, partitioned filters).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import Message

from core.config import Settings
from core.errors import DecodeError
from schemas.codec import Codec
from schemas.records import Seen
from schemas.stages import StoreDecl
from streams.io import raw_value
from streams.state_store import StateStore, Transform
from streams.store_open import open_declared, open_store

log = logging.getLogger("crawlfleet.seen")

DONE, RETRYING, DEAD = "DONE", "RETRYING", "DEAD"

#: Layout of a partition's DB; another layout is wiped and rebuilt from the changelog.
FORMAT = b"seen-v2"  # v2: values carry their write time (the TTL)

_STATE_CODES = {DONE: 0, RETRYING: 1, DEAD: 2}
_STATES = (DONE, RETRYING, DEAD)


def encode_value(state: str, attempt: int, written_s: int | None = None) -> bytes:
    """(state, attempt[, written]) → 1 state byte + the zigzag varint of ``attempt`` (2 bytes
    typically) + the varint of the write time in epoch seconds, if given (for the TTL)."""
    try:
        code = _STATE_CODES[state]
    except KeyError:
        raise ValueError(f"unknown seen state {state!r}") from None
    if not -(1 << 63) <= attempt < (1 << 63):
        raise ValueError(f"attempt out of range: {attempt}")
    out = bytearray((code,))
    _varint(out, (attempt << 1) ^ (attempt >> 63))  # zigzag: small stays small, either sign
    if written_s is not None:
        if written_s < 0:
            raise ValueError(f"write time out of range: {written_s}")
        _varint(out, written_s)
    return bytes(out)


def _varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def decode_value(raw: bytes) -> tuple[str, int]:
    """Inverse of :func:`encode_value`: (state, attempt)."""
    return _entry(raw)[0]


def decode_entry(raw: bytes) -> tuple[str, int, int | None]:
    """(state, attempt, write time in epoch seconds or None) of a stored value."""
    (state, attempt), written = _entry(raw)
    return state, attempt, written


def _entry(raw: bytes) -> tuple[tuple[str, int], int | None]:
    """((state, attempt), write time): the shape :meth:`StateStore.get_as` decodes to."""
    if not raw or raw[0] >= len(_STATES):
        raise ValueError(f"corrupt seen value {raw!r}")
    nums: list[int] = []
    n = shift = 0
    for b in raw[1:]:
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            nums.append(n)
            n = shift = 0
    if shift or not 1 <= len(nums) <= 2:
        raise ValueError(f"corrupt seen value {raw!r}")
    attempt = (nums[0] >> 1) ^ -(nums[0] & 1)
    return (_STATES[raw[0]], attempt), nums[1] if len(nums) == 2 else None


def _written_of(raw: bytes) -> int | None:
    return _entry(raw)[1]


def _written_now(raw: bytes) -> tuple[tuple[int], int | None]:
    """((write time,), write time) for :meth:`StateStore.get_as`; no time: now."""
    written = _written_of(raw)
    return (int(time.time()) if written is None else written,), written


def restored_value(codec: Codec) -> Transform:
    """Changelog record (Avro ``Seen``) → the stored value, its write time the record's
    timestamp (None: undecodable, skipped: never a crash loop on one record)."""
    def transform(msg: Message) -> bytes | None:
        value = raw_value(msg)
        if value is None:
            return None
        written = msg.timestamp()[1] // 1000
        try:
            rec = codec.decode_as(Seen, value, msg.headers())
            return encode_value(rec["state"], rec["attempt"], written if written > 0 else None)
        except (DecodeError, ValueError, KeyError) as exc:
            log.debug("seen restore: undecodable record for %r: %s", msg.key(), exc)
            return None
    return transform


class SeenStore:
    """key (profile|canonical URL) → (state, attempt), one RocksDB per owned partition."""

    def __init__(self, store: StateStore) -> None:
        #: The partitions' DBs, checkpoints, restore and TTL (keys older than the TTL are
        #: gone, as they are from the changelog through its retention), opened by the
        #: runtime as the stage declares the store.
        self.store = store

    @classmethod
    def declared(cls, decl: StoreDecl, settings: Settings, worker: str) -> SeenStore:
        """The fetch stage's declared ``seen`` store of ``worker``, opened by the runtime."""
        return cls(open_declared(decl, settings, worker, format_tag=FORMAT,
                                 written_of=_written_of))

    @classmethod
    def at(cls, directory: Path | None = None, ttl_s: float | None = None) -> SeenStore:
        """A seen store in ``directory`` (a temporary one if None): tools and tests."""
        return cls(open_store("seen", directory, tuning="large", format_tag=FORMAT,
                              ttl_s=ttl_s, written_of=_written_of))

    @property
    def directory(self) -> Path:
        return self.store.directory

    @property
    def ttl_s(self) -> float | None:
        return self.store.ttl_s

    # --- partitions ---------------------------------------------------------------------

    def partitions(self) -> set[int]:
        return self.store.partitions()

    def path_of(self, partition: int) -> Path:
        return self.store.path_of(partition)

    def open(self, partition: int) -> None:
        """Open (creating if new) the partition's DB without reading the changelog."""
        self.store.open(partition)

    def drop(self, partition: int) -> None:
        """Close a revoked partition's DB; its files stay as the checkpoint for next time."""
        self.store.drop(partition)

    def close(self) -> None:
        self.store.close()

    # --- reads and writes ---------------------------------------------------------------

    def get(self, partition: int, key: str) -> tuple[str, int] | None:
        """(state, attempt) of ``key``, None if never seen or expired (one call per URL)."""
        return self.store.get_as(partition, key.encode(), _entry)

    def written(self, partition: int, key: str) -> int | None:
        """When ``key`` was written (epoch seconds), None if it is not here (or expired); a
        value without a write time reads as written now (young: never pruned for its age)."""
        found = self.store.get_as(partition, key.encode(), _written_now)
        return None if found is None else found[0]

    def put_many(self, items: Iterable[tuple[int, str, str | None, int]],
                 checkpoints: dict[int, int] | None = None) -> None:
        """Apply committed changes: (partition, key, state, attempt), a None state deleting
        the key (a pruned visit's, see ``visit_prune``); with ``checkpoints`` (partition →
        changelog offset after the transaction's last write), move each checkpoint past
        these writes in the same batch, so a restore reads only the tail."""
        now_s = int(time.time())
        self.store.write(((p, key.encode(),
                           None if state is None else encode_value(state, attempt, now_s))
                          for p, key, state, attempt in items), checkpoints)

    def sweep(self, budget: int = 20_000) -> int:
        """Delete expired entries among the next ``budget`` keys (see
        :meth:`StateStore.sweep`); returns the number deleted."""
        return self.store.sweep(budget)

    def __len__(self) -> int:
        """Approximate key count (RocksDB's estimate), for the gauge."""
        return self.store.estimate_keys()

    def checkpoint(self, partition: int) -> int:
        """Next changelog offset ``restore`` reads for an open partition (0 if never)."""
        return self.store.checkpoint(partition)

    # --- restore ------------------------------------------------------------------------

    def restore(self, settings: Settings, topic: str, partitions: list[int],
                codec: Codec, timeout_s: float = 120.0) -> int:
        """Open ``partitions`` and apply the changelog from each one's checkpoint to its end.

        Returns the number of changelog records applied (tombstones included). A partition
        whose end was not reached in ``timeout_s`` is closed again: never used partial.
        """
        return self.restore_partitions(settings, topic, partitions, codec, timeout_s)[0]

    def restore_partitions(self, settings: Settings, topic: str, partitions: list[int],
                           codec: Codec, timeout_s: float = 120.0) -> tuple[int, set[int]]:
        """:meth:`restore`, also returning the partitions it could not complete (closed)."""
        return self.store.restore_partitions(settings, topic, partitions,
                                             restored_value(codec), timeout_s)
