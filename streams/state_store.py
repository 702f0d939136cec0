"""A partition-owned, sorted key → bytes store restored from a compacted changelog topic.

The way Kafka Streams state stores work: the topic is the source of truth, the local
RocksDB (one per owned partition, ``<directory>/p<N>``) a cache of its committed state.
A stage writes each change to the changelog inside the transaction that commits the work
behind it, and applies it here (:meth:`apply`) only after that transaction committed, so
the store is never ahead of committed state. The changelog key is the store key, so a
tombstone deletes exactly what its put created.

Each DB holds a *checkpoint* beside the data (the next changelog offset to read), written in
the same write batch as the records read up to it; :meth:`restore` reads from there to the
log end with a ``read_committed`` consumer. Our own applied writes after the checkpoint are
also in that tail, so replaying them is harmless. A checkpoint off the log (retention moved
the start past it, or the topic was recreated) wipes the partition and rebuilds it from the
log start. Writes skip RocksDB's WAL: a crash loses at most the unflushed suffix, data and
checkpoint together, which the tail re-applies.

Keys are ordered bytes, so a caller lays them out to scan in the order it needs: the fetch
stage's parked queues as ``target, tier, frontier offset``; the retry stage's timers by due
time. Reserved keys start with NUL, which callers' keys never do.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from rocksdict import DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from core.config import Settings
from core.errors import InfraError
from infra.live_state import high_watermarks
from streams.io import consume_ready, tp_of

log = logging.getLogger("crawlfleet.state")

META = b"\x00"
KEY_CHECKPOINT = b"\x00checkpoint"
KEY_TOPIC = b"\x00topic"
KEY_FORMAT = b"\x00format"

#: Turns one changelog record into the bytes to store (None: skip it, with a log line).
Transform = Callable[[Message], bytes | None]


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
        starts = {p: start_of(consumer, p) for p in partitions}
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
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
    """Committed state of the changelog partitions this worker owns, on local disk."""

    def __init__(self, name: str, directory: Path | None = None) -> None:
        self.name = name
        self._temp = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix=f"crawlfleet-{name}-")) \
            if directory is None else directory
        self._format = f"{name}-v1".encode()
        self._lock = threading.RLock()  # reads on the event loop, writes on Kafka's thread
        self._parts: dict[int, Rdict] = {}
        self._options = Options(raw_mode=True)
        self._options.create_if_missing(True)
        self._options.set_compression_type(DBCompressionType.lz4())
        self._options.set_write_buffer_size(4 * 1024 * 1024)
        self._options.set_max_write_buffer_number(2)
        self._options.set_keep_log_file_num(2)
        self._write = WriteOptions()
        # rocksdict's stub declares this property as a method; it is a settable attribute.
        self._write.disable_wal = True  # type: ignore[method-assign,assignment]
        self._closed = False

    # --- partitions ---------------------------------------------------------------------

    def partitions(self) -> set[int]:
        with self._lock:
            return set(self._parts)

    def open(self, partition: int) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} store is closed")
            if partition in self._parts:
                return
            path = self.directory / f"p{partition}"
            path.mkdir(parents=True, exist_ok=True)
            try:
                db = Rdict(str(path), self._options)
            except Exception as exc:  # rocksdict raises plain Exception
                raise InfraError(f"cannot open {self.name} store {path}: {exc} (is another "
                                 "worker running with the same worker id and data dir?)") from exc
            if db.get(KEY_FORMAT) != self._format:
                db = self._wipe(db, path)
            self._parts[partition] = db

    def _wipe(self, db: Rdict, path: Path) -> Rdict:
        db.close()
        Rdict.destroy(str(path), self._options)
        path.mkdir(parents=True, exist_ok=True)
        fresh = Rdict(str(path), self._options)
        batch = WriteBatch(raw_mode=True)
        batch.put(KEY_FORMAT, self._format)
        batch.put(KEY_TOPIC, b"")
        batch.put(KEY_CHECKPOINT, (0).to_bytes(8, "big"))
        fresh.write(batch, self._write)
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

    # --- reads and writes ---------------------------------------------------------------

    def get(self, partition: int, key: bytes) -> bytes | None:
        with self._lock:
            db = self._parts.get(partition)
            return None if db is None or key.startswith(META) else db.get(key)

    def scan(self, partition: int, prefix: bytes = b"", limit: int | None = None,
             start: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) pairs whose key starts with ``prefix``, in key order,
        from ``start`` (inclusive) if given."""
        out: list[tuple[bytes, bytes]] = []
        with self._lock:
            db = self._parts.get(partition)
            if db is None:
                return out
            for k, v in self._iter(db, start if start is not None else prefix or b"\x01"):
                if not k.startswith(prefix) or (limit is not None and len(out) >= limit):
                    break
                out.append((k, v))
        return out

    @staticmethod
    def _iter(db: Rdict, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = db.iter()
        it.seek(start)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def apply(self, partition: int, changes: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Apply committed changes of one partition: (key, value), None deleting."""
        with self._lock:
            db = self._parts.get(partition)
            if db is None:
                return  # revoked meanwhile: not ours to keep
            batch = WriteBatch(raw_mode=True)
            for k, v in changes:
                if k.startswith(META):
                    log.warning("%s: refusing reserved key %r", self.name, k)
                elif v is None:
                    batch.delete(k)
                else:
                    batch.put(k, v)
            db.write(batch, self._write)

    def advance(self, nexts: dict[int, int]) -> None:
        """Move checkpoints past committed writes already applied here (``partition → next
        offset``), so the next restore reads only what came after them.

        Only valid for a partition this worker owns and has restored: every record between
        its checkpoint and ``next`` is then either restored or one of its own applied
        writes (aborted ones are never read, and no one else writes while it owns it).
        """
        with self._lock:
            for part, nxt in nexts.items():
                db = self._parts.get(part)
                if db is None:
                    continue
                raw = db.get(KEY_CHECKPOINT)
                if raw is not None and int.from_bytes(raw, "big") >= nxt:
                    continue
                db.put(KEY_CHECKPOINT, nxt.to_bytes(8, "big"), self._write)

    def checkpoint(self, partition: int) -> int:
        with self._lock:
            raw = self._parts[partition].get(KEY_CHECKPOINT)
        return 0 if raw is None else int.from_bytes(raw, "big")

    # --- restore ------------------------------------------------------------------------

    def restore(self, settings: Settings, topic: str, partitions: Iterable[int],
                transform: Transform, timeout_s: float = 120.0) -> set[int]:
        """Open ``partitions`` and apply the changelog from each checkpoint to its end.

        Returns the partitions whose restore did not complete in ``timeout_s``: the caller
        must not use them (a partial store would resurrect or lose work).
        """
        todo = [p for p in partitions if p not in self.partitions()]
        if not todo:
            return set()
        for p in todo:
            self.open(p)

        def apply(records: dict[int, list[Message]], nexts: dict[int, int]) -> None:
            changes = {part: [c for c in (self._change_of(m, transform) for m in msgs)
                              if c is not None] for part, msgs in records.items()}
            self._write_progress(topic, changes, nexts)

        pending = tail_changelog(settings, self.name, topic, todo,
                                 lambda c, p: self._start_offset(c, topic, p), apply, timeout_s)
        if pending:
            log.error("%s restore of partitions %s incomplete after %ss: they stay unused",
                      self.name, sorted(pending), timeout_s)
            for p in pending:
                self.drop(p)
        return pending

    def _change_of(self, msg: Message, transform: Transform) -> tuple[bytes, bytes | None] | None:
        key = msg.key()
        if key is None:
            return None
        k = key.encode() if isinstance(key, str) else key
        if k.startswith(META):
            return None
        if msg.value() is None:
            return k, None
        value = transform(msg)
        if value is None:
            log.warning("%s restore: skipping unreadable record %r", self.name, k)
            return None
        return k, value

    def _start_offset(self, consumer: Consumer, topic: str, partition: int) -> int:
        with self._lock:
            db = self._parts.get(partition)
            raw_topic = db.get(KEY_TOPIC) if db is not None else None
            raw_ckpt = db.get(KEY_CHECKPOINT) if db is not None else None
        ckpt = 0 if raw_ckpt is None else int.from_bytes(raw_ckpt, "big")
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=30.0)
        except KafkaException as exc:
            log.warning("%s p%d: watermarks unavailable (%s); reading from checkpoint %d",
                        self.name, partition, exc, ckpt)
            return ckpt
        if db is None:
            # Dropped while the restore began (revoked meanwhile): nothing to read into,
            # and the other partitions of this restore go on (they used to fail with it).
            return high
        if (raw_topic and raw_topic != topic.encode()) or not low <= ckpt <= high:
            with self._lock:
                self._parts[partition] = self._wipe(db, self.directory / f"p{partition}")
            return low
        return ckpt

    def _write_progress(self, topic: str, changes: dict[int, list[tuple[bytes, bytes | None]]],
                        nexts: dict[int, int]) -> None:
        with self._lock:
            for part, nxt in nexts.items():
                db = self._parts.get(part)
                if db is None:
                    continue
                batch = WriteBatch(raw_mode=True)
                for k, v in changes.get(part, ()):
                    if v is None:
                        batch.delete(k)
                    else:
                        batch.put(k, v)
                batch.put(KEY_TOPIC, topic.encode())
                batch.put(KEY_CHECKPOINT, nxt.to_bytes(8, "big"))
                db.write(batch, self._write)
