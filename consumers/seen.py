"""Dedupe state per owned partition: a local RocksDB restored from the ``crawl.seen`` changelog.

The fetch stage owns a target's frontier partition and the same-numbered ``crawl.seen``
partition; it writes every state change to ``crawl.seen`` inside the transaction that commits
the work, and applies the change here (``put_many``) only after that transaction committed, so
this store is never ahead of committed state.

Each partition is one RocksDB under ``<directory>/p<N>``. Beside the dedupe keys it holds a
*checkpoint*: the next changelog offset to read, written atomically (same write batch) with the
records read up to it. ``restore`` reads the changelog from the checkpoint to its end with a
``read_committed`` consumer and applies it in order (last write wins; a null value deletes).
Records written by ``put_many`` after the checkpoint are our own committed writes, which are also
in that tail, so replaying them is harmless and a restore after a crash, a revocation or another
owner's tenure converges to exactly the committed state. Because the changelog is the source of
truth, writes skip RocksDB's WAL: a crash loses at most the unflushed suffix of writes (data and
checkpoint together, one column family flushes in sequence order), which the tail re-applies.

If the checkpoint no longer fits the log (log start moved past it through retention, or the
topic was recreated and is shorter), the partition is wiped and rebuilt from the log start, so
keys that expired from the topic also leave the store.

Memory does not grow with the key count: one small LRU block cache per store (shared by its
partitions) holds data, index and filter blocks; memtables are bounded by a write-buffer manager
charged to that cache. Index and bloom filters are *partitioned*: a monolithic filter of a few
MB is larger than one shard of a 16 MB sharded cache, so it would be re-read on every get (we
measured ~70x slower gets at 2M keys). Small SST files bound what a compaction builds in memory.
Keys are the UTF-8 bytes of ``profile|canonical-URL``; values are the compact
:func:`encode_value` bytes (1 state byte + a zigzag varint attempt), never Avro.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from core.config import Settings
from core.errors import DecodeError, InfraError
from schemas.codec import Codec, HeadersIn
from schemas.records import Seen
from streams.io import raw_value
from streams.state_store import tail_changelog

log = logging.getLogger("crawlfleet.seen")

DONE, RETRYING, DEAD = "DONE", "RETRYING", "DEAD"

#: Memory budget of one store (all its partitions): block cache, with memtables charged to it.
BLOCK_CACHE_BYTES = 16 * 1024 * 1024
WRITE_BUFFER_BYTES = 8 * 1024 * 1024  # total memtable budget of the store (inside the cache)
MEMTABLE_BYTES = 4 * 1024 * 1024  # one memtable of one partition
TARGET_FILE_BYTES = 8 * 1024 * 1024  # SST size: a compaction holds one file's index/filter
LEVEL_BASE_BYTES = 32 * 1024 * 1024  # levels form early: a flush is not merged into everything

# Reserved keys: dedupe keys are "profile|URL" text and never start with NUL (put/apply refuse
# any that would), so these can never collide with one.
META_PREFIX = b"\x00"
KEY_CHECKPOINT = b"\x00checkpoint"  # next changelog offset to read, 8 bytes big-endian
KEY_FORMAT = b"\x00format"  # layout of this DB; another layout is wiped and rebuilt
KEY_TOPIC = b"\x00topic"  # changelog topic the checkpoint refers to
FORMAT = b"seen-v2"  # v2: values carry their write time (the TTL)
_META_KEYS = 3

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
    state, attempt, _ = decode_entry(raw)
    return state, attempt


def decode_entry(raw: bytes) -> tuple[str, int, int | None]:
    """(state, attempt, write time in epoch seconds or None) of a stored value."""
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
    return _STATES[raw[0]], attempt, nums[1] if len(nums) == 2 else None


def _key_bytes(key: str | bytes) -> bytes | None:
    k = key.encode() if isinstance(key, str) else key
    return None if k.startswith(META_PREFIX) else k


class SeenStore:
    """key (profile|canonical URL) → (state, attempt), one RocksDB per owned partition."""

    def __init__(self, directory: Path | None = None, ttl_s: float | None = None) -> None:
        #: Keys older than this are gone, as they are from the changelog (its retention).
        self.ttl_s = ttl_s
        self._sweep_at: tuple[int, bytes] = (0, b"")  # where the next expiry sweep goes on
        self._temp = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="crawlfleet-seen-")) if directory is None \
            else directory
        self._lock = threading.RLock()  # get() runs on the event loop, the rest on Kafka's thread
        self._parts: dict[int, Rdict] = {}
        self._cache = Cache(BLOCK_CACHE_BYTES)
        self._wbm = WriteBufferManager.new_write_buffer_manager_with_cache(
            WRITE_BUFFER_BYTES, False, self._cache)
        self._options = self._make_options()
        self._write = WriteOptions()
        # The changelog is the log (see the module docstring). rocksdict's stub declares this
        # property as a method; at run time it is a settable attribute.
        self._write.disable_wal = True  # type: ignore[method-assign,assignment]
        self._closed = False

    def _make_options(self) -> Options:
        table = BlockBasedOptions()
        table.set_block_cache(self._cache)
        table.set_bloom_filter(10, False)  # full filter, ~1% false positives: cheap misses
        table.set_cache_index_and_filter_blocks(True)  # index/filters live in the cache too
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)  # only the small top level stays pinned
        table.set_pin_top_level_index_and_filter(True)
        table.set_format_version(5)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(self._wbm)
        opts.set_write_buffer_size(MEMTABLE_BYTES)
        opts.set_max_write_buffer_number(2)
        opts.set_compression_type(DBCompressionType.lz4())
        opts.set_bottommost_compression_type(DBCompressionType.zstd())
        opts.set_level_compaction_dynamic_level_bytes(True)
        opts.set_max_background_jobs(2)
        opts.set_target_file_size_base(TARGET_FILE_BYTES)
        opts.set_max_bytes_for_level_base(LEVEL_BASE_BYTES)
        opts.set_max_open_files(256)
        opts.set_keep_log_file_num(2)  # every open rolls RocksDB's info LOG
        opts.set_max_log_file_size(1024 * 1024)
        return opts

    # --- partitions ---------------------------------------------------------------------

    def partitions(self) -> set[int]:
        with self._lock:
            return set(self._parts)

    def path_of(self, partition: int) -> Path:
        return self.directory / f"p{partition}"

    def open(self, partition: int) -> None:
        """Open (creating if new) the partition's DB without reading the changelog."""
        with self._lock:
            if self._closed:
                raise RuntimeError("seen store is closed")
            if partition in self._parts:
                return
            path = self.path_of(partition)
            path.mkdir(parents=True, exist_ok=True)
            try:
                db = Rdict(str(path), self._options)
            except Exception as exc:  # rocksdict raises plain Exception
                raise InfraError(f"cannot open seen store {path}: {exc} (is another worker "
                                 "running with the same worker id and data dir?)") from exc
            fmt = db.get(KEY_FORMAT)
            if fmt is None:
                self._init_meta(db)
            elif fmt != FORMAT:
                log.warning("seen p%d: layout %r is not %r; rebuilding", partition, fmt, FORMAT)
                db = self._wipe(db, path)
            self._parts[partition] = db

    def _init_meta(self, db: Rdict) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(KEY_FORMAT, FORMAT)
        batch.put(KEY_TOPIC, b"")  # not yet read from any changelog
        batch.put(KEY_CHECKPOINT, (0).to_bytes(8, "big"))
        db.write(batch, self._write)

    def _wipe(self, db: Rdict, path: Path) -> Rdict:
        db.close()
        Rdict.destroy(str(path), self._options)
        path.mkdir(parents=True, exist_ok=True)
        fresh = Rdict(str(path), self._options)
        self._init_meta(fresh)
        return fresh

    def drop(self, partition: int) -> None:
        """Close a revoked partition's DB; its files stay as the checkpoint for next time."""
        with self._lock:
            db = self._parts.pop(partition, None)
            if db is not None:
                _close(db)

    def close(self) -> None:
        with self._lock:
            for p in list(self._parts):
                self.drop(p)
            self._closed = True
            if self._temp:
                shutil.rmtree(self.directory, ignore_errors=True)

    # --- reads and writes ---------------------------------------------------------------

    def get(self, partition: int, key: str) -> tuple[str, int] | None:
        k = _key_bytes(key)
        with self._lock:
            db = self._parts.get(partition)
            raw = None if db is None or k is None else db.get(k)
        if raw is None:
            return None
        state, attempt, written = decode_entry(raw)
        if self._expired(written, time.time()):
            return None
        return state, attempt

    def _expired(self, written_s: int | None, now_s: float) -> bool:
        return self.ttl_s is not None and written_s is not None \
            and now_s - written_s > self.ttl_s

    def put_many(self, items: Iterable[tuple[int, str, str, int]],
                 checkpoints: dict[int, int] | None = None) -> None:
        """Apply committed changes: (partition, key, state, attempt); with ``checkpoints``
        (partition → changelog offset after the transaction's last write), move each
        checkpoint past these writes in the same batch, so a restore reads only the tail."""
        batches: dict[int, WriteBatch] = {}
        now_s = int(time.time())
        with self._lock:
            for partition, key, state, attempt in items:
                if partition not in self._parts:
                    continue  # a partition revoked meanwhile is not ours to keep
                k = _key_bytes(key)
                if k is None:
                    log.warning("seen: refusing reserved key %r", key)
                    continue
                batch = batches.get(partition)
                if batch is None:
                    batch = batches[partition] = WriteBatch(raw_mode=True)
                batch.put(k, encode_value(state, attempt, now_s))
            for partition, nxt in (checkpoints or {}).items():
                if partition in self._parts:
                    batch = batches.get(partition)
                    if batch is None:
                        batch = batches[partition] = WriteBatch(raw_mode=True)
                    batch.put(KEY_CHECKPOINT, nxt.to_bytes(8, "big"))
            for partition, batch in batches.items():
                self._parts[partition].write(batch, self._write)

    def sweep(self, budget: int = 20_000) -> int:
        """Delete up to ``budget`` keys' worth of expired entries, resuming where the last
        sweep stopped (reads already ignore them: this gives the disk back). Returns the
        number deleted."""
        if self.ttl_s is None:
            return 0
        now_s = time.time()
        deleted = 0
        with self._lock:
            parts = sorted(self._parts)
            if not parts:
                return 0
            part, start = self._sweep_at
            if part not in self._parts:
                part, start = parts[0], b""
            db = self._parts[part]
            it = db.iter()
            it.seek(start or b"\x01")
            batch = WriteBatch(raw_mode=True)
            seen = 0
            while it.valid() and seen < budget:
                k, v = it.key(), it.value()
                seen += 1
                try:
                    expired = self._expired(decode_entry(v)[2], now_s)
                except ValueError:
                    expired = True  # unreadable: the changelog has the truth
                if expired:
                    batch.delete(k)
                    deleted += 1
                it.next()
            if it.valid():
                self._sweep_at = (part, it.key())
            else:  # this partition is done: the next one, from its start
                later = [p for p in parts if p > part]
                self._sweep_at = (later[0] if later else parts[0], b"")
            if deleted:
                db.write(batch, self._write)
        return deleted

    def __len__(self) -> int:
        """Approximate key count (RocksDB's estimate), for the gauge."""
        with self._lock:
            dbs = list(self._parts.values())
            return sum(max(0, (db.property_int_value("rocksdb.estimate-num-keys") or 0)
                           - _META_KEYS) for db in dbs)

    def checkpoint(self, partition: int) -> int:
        """Next changelog offset ``restore`` reads for an open partition (0 if never)."""
        with self._lock:
            raw = self._parts[partition].get(KEY_CHECKPOINT)
        return 0 if raw is None else int.from_bytes(raw, "big")

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
        todo = [p for p in partitions if p not in self.partitions()]
        if not todo:
            return 0, set()
        for p in todo:
            self.open(p)
        n = 0
        now_s = time.time()

        def apply(records: dict[int, list[Message]], nexts: dict[int, int]) -> None:
            nonlocal n
            batches: dict[int, WriteBatch] = {}
            for part, msgs in records.items():
                batch = batches[part] = WriteBatch(raw_mode=True)
                for msg in msgs:
                    written = msg.timestamp()[1] // 1000
                    n += self._apply(batch, msg.key(), raw_value(msg), msg.headers(), codec,
                                     written if written > 0 else None, now_s)
            self._write_progress(topic, batches, nexts)

        pending = tail_changelog(settings, "seen", topic, todo,
                                 lambda c, p: self._start_offset(c, topic, p, timeout_s),
                                 apply, timeout_s)
        if pending:
            log.error("seen restore of partitions %s incomplete after %ss: they stay unused "
                      "(resumed from their checkpoint next time)", sorted(pending), timeout_s)
            for p in pending:
                self.drop(p)
        return n, pending

    def _start_offset(self, consumer: Consumer, topic: str, partition: int,
                      timeout_s: float) -> int:
        """The checkpoint, or the log start after wiping a DB whose checkpoint is off the log."""
        with self._lock:
            db = self._parts.get(partition)
            raw_topic = db.get(KEY_TOPIC) if db is not None else None
            raw_ckpt = db.get(KEY_CHECKPOINT) if db is not None else None
        ckpt = 0 if raw_ckpt is None else int.from_bytes(raw_ckpt, "big")
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=min(timeout_s, 30.0))
        except KafkaException as exc:
            log.warning("seen p%d: watermarks unavailable (%s); reading from checkpoint %d",
                        partition, exc, ckpt)
            return ckpt
        if db is None:  # dropped (revoked) as the restore began: the others go on
            return high
        stale = bool(raw_topic) and raw_topic != topic.encode()
        if stale or ckpt < low or ckpt > high:
            # Records we never applied are gone (retention) or the log is not the one we read
            # (topic recreated): only a rebuild from the log start gives the committed state.
            log.info("seen p%d: checkpoint %d outside log [%d, %d] of %s; rebuilding",
                     partition, ckpt, low, high, topic)
            with self._lock:
                self._parts[partition] = self._wipe(db, self.path_of(partition))
            return low
        return ckpt

    def _write_progress(self, topic: str, batches: dict[int, WriteBatch],
                        nexts: dict[int, int]) -> None:
        """Write applied records and the new checkpoint of each partition in one batch."""
        with self._lock:
            for part, nxt in nexts.items():
                db = self._parts.get(part)
                if db is None:
                    continue
                batch = batches.pop(part, None) or WriteBatch(raw_mode=True)
                batch.put(KEY_TOPIC, topic.encode())
                batch.put(KEY_CHECKPOINT, nxt.to_bytes(8, "big"))
                db.write(batch, self._write)

    def _apply(self, batch: WriteBatch, key: str | bytes | None, value: bytes | None,
               headers: HeadersIn, codec: Codec, written_s: int | None = None,
               now_s: float = 0.0) -> int:
        if key is None:
            return 0
        k = _key_bytes(key)
        if k is None:
            log.warning("seen restore: skipping reserved key %r", key)
            return 0
        if value is None:
            batch.delete(k)
            return 1
        if self._expired(written_s, now_s):  # past the TTL: gone from the topic too
            batch.delete(k)
            return 1
        try:
            rec = codec.decode_as(Seen, value, headers)
            batch.put(k, encode_value(rec["state"], rec["attempt"], written_s))
        except (DecodeError, ValueError, KeyError) as exc:  # never a crash loop on one record
            log.warning("seen restore: skipping undecodable record for %r: %s", key, exc)
            return 0
        return 1


def _close(db: Rdict) -> None:
    db.flush()  # no WAL: persist the memtable so the checkpoint's data is on disk
    db.close()
