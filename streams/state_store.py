"""A partition-owned, sorted key → bytes store restored from a compacted changelog topic.

The way Kafka Streams state stores work: the topic is the source of truth, the local
RocksDB (one per owned partition, ``<directory>/p<N>``) a cache of its committed state.
A stage writes each change to the changelog inside the transaction that commits the work
behind it, and applies it here (:meth:`StateStore.write`, :meth:`~StateStore.apply`) only
after that transaction committed, so the store is never ahead of committed state. The
changelog key is the store key, so a tombstone deletes exactly what its put created.

Each DB holds a *checkpoint* beside the data (the next changelog offset to read), written in
the same write batch as the records read or applied up to it; :meth:`~StateStore.restore`
reads from there to the log end with a ``read_committed`` consumer (the high watermark, not
the last stable offset: see :func:`tail_changelog`) and applies it in order (last write
wins; a null value deletes). Our own applied writes after the checkpoint are also in that
tail, so replaying them is harmless, and a restore after a crash, a revocation or another
owner's tenure converges to exactly the committed state. A checkpoint off the log (retention
moved the start past it, or the topic was recreated) wipes the partition and rebuilds it
from the log start, so keys that left the topic also leave the store. Writes skip RocksDB's
WAL, because the changelog is the log: a crash loses at most the unflushed suffix, data and
checkpoint together (one column family flushes in sequence order), which the tail
re-applies. A DB of another *format* (the tag of a store's value layout, kept beside the
checkpoint) is wiped and rebuilt the same way.

A store may have a TTL, for a changelog whose retention forgets keys (``delete`` beside
``compact``): values then carry their write time (the caller's ``written_of`` reads it), a
read hides an expired value, :meth:`~StateStore.sweep` deletes expired ones a slice at a
time to give the disk back, and a restore drops records older than the TTL by the changelog
record's timestamp, as the topic is about to.

Keys are ordered bytes, so a caller lays them out to scan in the order it needs: the fetch
stage's parked queues as ``target, tier, frontier offset``; the retry stage's timers by due
time. Reserved keys start with NUL, which callers' keys never do (writes refuse them).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from rocksdict import DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from core.config import Settings
from core.errors import InfraError
from infra.live_state import high_watermarks
from streams.io import consume_ready, tp_of

log = logging.getLogger("crawlfleet.state")

# Reserved keys: callers' keys never start with NUL (writes refuse any that would).
META = b"\x00"
KEY_CHECKPOINT = b"\x00checkpoint"  # next changelog offset to read, 8 bytes big-endian
KEY_TOPIC = b"\x00topic"  # changelog topic the checkpoint refers to
KEY_FORMAT = b"\x00format"  # layout of this DB; another layout is wiped and rebuilt
META_KEYS = 3  # reserved keys per DB: not counted by :meth:`StateStore.estimate_keys`

#: Turns one changelog record into the bytes to store (None: skip it, with a log line).
Transform = Callable[[Message], bytes | None]
#: A stored value's write time in epoch seconds (None: it never expires), for a store with a
#: TTL; raises ValueError for an unreadable value (a sweep deletes it).
WrittenOf = Callable[[bytes], int | None]
#: One committed change: (partition, key, value), a None value deleting the key.
Change = tuple[int, bytes, bytes | None]

T = TypeVar("T")


def default_options() -> Options:
    """RocksDB options of a store given none: small memtables, lz4, a short info LOG."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_write_buffer_size(4 * 1024 * 1024)
    options.set_max_write_buffer_number(2)
    options.set_keep_log_file_num(2)
    return options


def tail_changelog(settings: Settings, name: str, topic: str, partitions: list[int],
                   start_of: Callable[[Consumer, int], int],
                   apply: Callable[[dict[int, list[Message]], dict[int, int]], None],
                   timeout_s: float) -> set[int]:
    """Read each changelog partition from ``start_of`` to its *stable* end (``read_committed``).

    ``apply(records by partition, next offset by partition)`` is called once per poll, so a
    store can write each batch of records together with its new checkpoint. Returns the
    partitions whose end was not reached in ``timeout_s``.

    The end is reached when the read position meets the high watermark, not when a
    ``read_committed`` fetch first reports end-of-partition: that is the last stable offset,
    and the former owner's last transaction may still be open there (its markers not yet
    written, or a dead owner's transaction not yet timed out). Stopping at it would miss
    that transaction's writes, and the checkpoint would later be moved past them for good.
    The wait is bounded by the transaction timeout (then the transaction aborts).
    """
    conf = {**settings.kafka_common(), "group.id": f"crawlfleet-{name}-restore",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "enable.partition.eof": True, "auto.offset.reset": "earliest",
            # End-of-partition is only seen when a fetch returns: do not let the broker hold
            # an empty fetch open for the default 500 ms.
            "fetch.wait.max.ms": 10}
    consumer = Consumer(conf)
    admin = AdminClient(settings.kafka_common())
    pending = set(partitions)
    try:
        # Watermarks as a read_uncommitted client sees them: the high one counts records of
        # a transaction still open, so a start at it has nothing after it, settled or not.
        marks = _RecordedWatermarks(Consumer({**conf, "isolation.level": "read_uncommitted"}))
        try:
            starts = {p: start_of(cast(Consumer, marks), p) for p in partitions}
        finally:
            marks.close()
        high = marks.high
        # A partition whose start is its high watermark (nothing ever written, or read to
        # the end before) has nothing to read and no open transaction: done without a
        # fetch (most partitions of a new crawl, each an end-of-partition wait otherwise).
        done = {p: o for p, o in starts.items()
                if p in high and (o == high[p] or (high[p] == 0 and o < 0))}
        if done:
            apply({}, {p: high[p] for p in done})
            pending -= set(done)
        if not pending:
            return pending
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()
                         if p not in done])
        deadline = time.monotonic() + timeout_s
        at_lso: dict[int, int] = {}  # partitions read to their last stable offset
        while pending and time.monotonic() < deadline:
            records: dict[int, list[Message]] = {}
            nexts: dict[int, int] = {}
            for msg in consume_ready(consumer, 1000, 0.1):
                part = tp_of(msg)[1]
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        end = msg.offset()
                        if end is not None and end >= 0:
                            at_lso[part] = end
                            nexts[part] = max(nexts.get(part, 0), end)
                    else:
                        log.warning("%s restore: %s", name, err)
                    continue
                at_lso.pop(part, None)
                records.setdefault(part, []).append(msg)
                offset = msg.offset()
                assert offset is not None
                nexts[part] = offset + 1
            apply(records, nexts)
            waiting = pending & set(at_lso)
            if waiting:
                pending -= _settled(settings, admin, consumer, topic, waiting, at_lso)
    finally:
        consumer.close()
    return pending


class _RecordedWatermarks:
    """A consumer's ``get_watermark_offsets``, each answer's high watermark kept."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self.high: dict[int, int] = {}

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout)
        self.high[tp.partition] = int(high)
        return int(low), int(high)

    def close(self) -> None:
        self._consumer.close()


def _settled(settings: Settings, admin: AdminClient, consumer: Consumer, topic: str,
             parts: set[int], at_lso: dict[int, int]) -> set[int]:
    """Of ``parts`` (read to their last stable offset), those whose read position has met
    the high watermark: no transaction is open on them."""
    try:
        high = high_watermarks(settings, topic, sorted(parts), 5.0, admin)
    except InfraError as exc:
        log.warning("restore of %s: high watermarks unavailable (%s); waiting", topic, exc)
        return set()
    positions = {tp.partition: tp.offset
                 for tp in consumer.position([TopicPartition(topic, p) for p in parts])}
    return {p for p in parts if max(at_lso[p], positions.get(p, -1)) >= high.get(p, 0)}


def store_dir(settings: Settings, store: str, worker: str) -> Path:
    """Where ``worker`` keeps its local copy of ``store``: one directory per crawl namespace
    (the topic prefix) and worker, so crawls and workers never share one."""
    return settings.data_dir / store / (settings.topic_prefix.rstrip(".") or "default") / worker


class StateStore:
    """Committed state of the changelog partitions this worker owns, on local disk.

    ``options`` are the RocksDB options of every partition's DB (raw mode, creating missing
    DBs; :func:`default_options` if not given); ``format_tag`` the layout tag a DB must carry
    to be reused (``<name>-v1`` if not given). With ``ttl_s``, ``written_of`` reads a stored
    value's write time and values older than ``ttl_s`` seconds are gone (see the module
    docstring).
    """

    def __init__(self, name: str, directory: Path | None = None, *,
                 options: Options | None = None, format_tag: bytes | None = None,
                 ttl_s: float | None = None, written_of: WrittenOf | None = None) -> None:
        if ttl_s is not None and written_of is None:
            raise ValueError(f"{name} store: a TTL needs written_of to read values' write time")
        self.name = name
        self._temp = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix=f"crawlfleet-{name}-")) \
            if directory is None else directory
        self._format = format_tag if format_tag is not None else f"{name}-v1".encode()
        #: Values written longer ago than this are gone, as they are from the changelog.
        self.ttl_s = ttl_s
        self._written_of = written_of
        self._sweep_at: tuple[int, bytes] = (0, b"")  # where the next expiry sweep goes on
        self._lock = threading.RLock()  # reads on the event loop, writes on Kafka's thread
        self._parts: dict[int, Rdict] = {}
        self._options = options if options is not None else default_options()
        self._write = WriteOptions()
        # The changelog is the log (see the module docstring). rocksdict's stub declares this
        # property as a method; at run time it is a settable attribute.
        self._write.disable_wal = True  # type: ignore[method-assign,assignment]
        self._closed = False
        #: Objects the options refer to (a shared block cache), kept while the store lives.
        self.keep_alive: tuple[object, ...] = ()

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
                raise RuntimeError(f"{self.name} store is closed")
            if partition in self._parts:
                return
            path = self.path_of(partition)
            path.mkdir(parents=True, exist_ok=True)
            try:
                db = Rdict(str(path), self._options)
            except Exception as exc:  # rocksdict raises plain Exception
                raise InfraError(f"cannot open {self.name} store {path}: {exc} (is another "
                                 "worker running with the same worker id and data dir?)") from exc
            fmt = db.get(KEY_FORMAT)
            if fmt is None:  # new (meta keys are written first, so an empty DB)
                self._init_meta(db)
            elif fmt != self._format:
                log.warning("%s p%d: layout %r is not %r; rebuilding", self.name, partition,
                            fmt, self._format)
                db = self._wipe(db, path)
            self._parts[partition] = db

    def _init_meta(self, db: Rdict) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(KEY_FORMAT, self._format)
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
        """Close a revoked partition; its files stay as the checkpoint for next time."""
        with self._lock:
            db = self._parts.pop(partition, None)
            if db is not None:
                db.flush()  # no WAL: persist the memtable so the checkpoint's data is on disk
                db.close()

    def close(self) -> None:
        with self._lock:
            for p in list(self._parts):
                self.drop(p)
            self._closed = True
        if self._temp:
            shutil.rmtree(self.directory, ignore_errors=True)

    # --- reads --------------------------------------------------------------------------

    def get(self, partition: int, key: bytes) -> bytes | None:
        """The value of ``key`` (None if absent, expired, reserved or not an open partition)."""
        with self._lock:
            db = self._parts.get(partition)
            raw = None if db is None or key.startswith(META) else db.get(key)
        if raw is None or self.ttl_s is None:
            return raw
        return None if self._expired(self._written_of_or_none(raw), time.time()) else raw

    def get_as(self, partition: int, key: bytes,
               decode: Callable[[bytes], tuple[T, int | None]]) -> T | None:
        """:meth:`get` through ``decode`` (stored bytes → (value, write time)): one decode
        serves the caller and the TTL (the dedupe store's hot path)."""
        with self._lock:
            db = self._parts.get(partition)
            raw = None if db is None or key.startswith(META) else db.get(key)
        if raw is None:
            return None
        value, written = decode(raw)
        return None if self._expired(written, time.time()) else value

    def _expired(self, written_s: int | None, now_s: float) -> bool:
        return self.ttl_s is not None and written_s is not None \
            and now_s - written_s > self.ttl_s

    def _written_of_or_none(self, raw: bytes) -> int | None:
        assert self._written_of is not None  # a TTL comes with it (__init__)
        try:
            return self._written_of(raw)
        except ValueError:
            return None  # unreadable: not this read's business (a sweep deletes it)

    def scan(self, partition: int, prefix: bytes = b"", limit: int | None = None,
             start: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) pairs whose key starts with ``prefix``, in key order,
        from ``start`` (inclusive) if given; expired values are left out."""
        out: list[tuple[bytes, bytes]] = []
        now_s = time.time() if self.ttl_s is not None else None
        with self._lock:
            db = self._parts.get(partition)
            if db is None:
                return out
            for k, v in self._iter(db, start if start is not None else prefix or b"\x01"):
                if not k.startswith(prefix) or (limit is not None and len(out) >= limit):
                    break
                if now_s is None or not self._expired(self._written_of_or_none(v), now_s):
                    out.append((k, v))
        return out

    @staticmethod
    def _iter(db: Rdict, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = db.iter()
        it.seek(start)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def checkpoint(self, partition: int) -> int:
        """Next changelog offset a restore reads for an open partition (0 if never)."""
        with self._lock:
            raw = self._parts[partition].get(KEY_CHECKPOINT)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def estimate_keys(self) -> int:
        """Approximate key count of the open partitions (RocksDB's estimate, without the
        reserved keys), for a gauge."""
        with self._lock:
            return sum(max(0, (db.property_int_value("rocksdb.estimate-num-keys") or 0)
                           - META_KEYS) for db in self._parts.values())

    # --- writes -------------------------------------------------------------------------

    def write(self, changes: Iterable[Change], checkpoints: dict[int, int] | None = None) -> None:
        """Apply committed changes, (partition, key, value) with None deleting, and move the
        checkpoints in ``checkpoints`` (partition → changelog offset after the transaction's
        last write) past them: one write batch per partition, data and checkpoint together,
        so a restore reads only the tail.

        A partition not open (revoked meanwhile) is not ours to keep: skipped. A checkpoint
        only moves forward, and only for a partition this worker owns and has restored:
        every record between its checkpoint and the new one is then either restored or one
        of its own applied writes (aborted ones are never read, and no one else writes
        while it owns it).
        """
        batches: dict[int, WriteBatch] = {}
        with self._lock:
            parts = self._parts
            for part, k, v in changes:
                if part not in parts:
                    continue
                if k.startswith(META):
                    log.warning("%s: refusing reserved key %r", self.name, k)
                    continue
                batch = batches.get(part)
                if batch is None:
                    batch = batches[part] = WriteBatch(raw_mode=True)
                if v is None:
                    batch.delete(k)
                else:
                    batch.put(k, v)
            for part, nxt in (checkpoints or {}).items():
                db = parts.get(part)
                if db is None:
                    continue
                raw = db.get(KEY_CHECKPOINT)
                if raw is not None and int.from_bytes(raw, "big") >= nxt:
                    continue
                batch = batches.get(part)
                if batch is None:
                    batch = batches[part] = WriteBatch(raw_mode=True)
                batch.put(KEY_CHECKPOINT, nxt.to_bytes(8, "big"))
            for part, batch in batches.items():
                parts[part].write(batch, self._write)

    def apply(self, partition: int, changes: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Apply committed changes of one partition: (key, value), None deleting."""
        self.write((partition, k, v) for k, v in changes)

    def advance(self, nexts: dict[int, int]) -> None:
        """Move checkpoints past committed writes already applied here (``partition → next
        offset``), so the next restore reads only what came after them (see :meth:`write`)."""
        self.write((), nexts)

    def sweep(self, budget: int = 20_000) -> int:
        """Delete the expired entries among the next ``budget`` keys, resuming where the last
        sweep stopped (reads already ignore them: this gives the disk back). Returns the
        number deleted (0 without a TTL)."""
        if self.ttl_s is None or self._written_of is None:
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
                    expired = self._expired(self._written_of(v), now_s)
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

    # --- restore ------------------------------------------------------------------------

    def restore(self, settings: Settings, topic: str, partitions: Iterable[int],
                transform: Transform, timeout_s: float = 120.0) -> set[int]:
        """Open ``partitions`` and apply the changelog from each checkpoint to its end.

        Returns the partitions whose restore did not complete in ``timeout_s``: the caller
        must not use them (a partial store would resurrect or lose work).
        """
        return self.restore_partitions(settings, topic, partitions, transform, timeout_s)[1]

    def restore_partitions(self, settings: Settings, topic: str, partitions: Iterable[int],
                           transform: Transform, timeout_s: float = 120.0
                           ) -> tuple[int, set[int]]:
        """:meth:`restore`, also returning the number of changelog records applied
        (tombstones and expired records deleted included): ``(applied, incomplete)``.

        Partitions already open are left as they are. An incomplete partition is closed
        again (resumed from its checkpoint next time), never used partial.
        """
        todo = [p for p in partitions if p not in self.partitions()]
        if not todo:
            return 0, set()
        for p in todo:
            self.open(p)
        applied = 0
        now_s = time.time()

        def apply(records: dict[int, list[Message]], nexts: dict[int, int]) -> None:
            nonlocal applied
            batches: dict[int, WriteBatch] = {}
            for part, msgs in records.items():
                batch = batches[part] = WriteBatch(raw_mode=True)
                for msg in msgs:
                    applied += self._restore_one(batch, msg, transform, now_s)
            self._write_progress(topic, batches, nexts)

        pending = tail_changelog(settings, self.name, topic, todo,
                                 lambda c, p: self._start_offset(c, topic, p, timeout_s),
                                 apply, timeout_s)
        if pending:
            log.error("%s restore of partitions %s incomplete after %ss: they stay unused "
                      "(resumed from their checkpoint next time)", self.name, sorted(pending),
                      timeout_s)
            for p in pending:
                self.drop(p)
        return applied, pending

    def _restore_one(self, batch: WriteBatch, msg: Message, transform: Transform,
                     now_s: float) -> int:
        """Add one changelog record to ``batch``: 1 if it was applied, 0 if skipped."""
        key = msg.key()
        if key is None:
            return 0
        k = key.encode() if isinstance(key, str) else key
        if k.startswith(META):  # e.g. the retry stage's clock probes: never store data
            return 0
        if msg.value() is None:
            batch.delete(k)
            return 1
        if self.ttl_s is not None:
            written = msg.timestamp()[1] // 1000
            if written > 0 and self._expired(written, now_s):  # gone from the topic too
                batch.delete(k)
                return 1
        value = transform(msg)
        if value is None:
            log.warning("%s restore: skipping unreadable record %r", self.name, k)
            return 0
        batch.put(k, value)
        return 1

    def _start_offset(self, consumer: Consumer, topic: str, partition: int,
                      timeout_s: float = 30.0) -> int:
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
            log.warning("%s p%d: watermarks unavailable (%s); reading from checkpoint %d",
                        self.name, partition, exc, ckpt)
            return ckpt
        if db is None:
            # Dropped while the restore began (revoked meanwhile): nothing to read into,
            # and the other partitions of this restore go on (they used to fail with it).
            return high
        stale = bool(raw_topic) and raw_topic != topic.encode()
        if stale or not low <= ckpt <= high:
            # Records we never applied are gone (retention) or the log is not the one we read
            # (topic recreated): only a rebuild from the log start gives the committed state.
            log.info("%s p%d: checkpoint %d outside log [%d, %d] of %s; rebuilding",
                     self.name, partition, ckpt, low, high, topic)
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
