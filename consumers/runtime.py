"""The small shared stage runtime: clients, transactional commit, rewind, status, stop.

Every stage is consume → transform → produce, and commits its outputs together with its
input offsets (sent with the consumer group metadata, KIP-447) in one Kafka transaction.
A stale owner's commit is rejected by the broker (producer epoch / group generation), so
no worker's local clock ever decides who owns a partition.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from consumers import faults
from crawlfleet import __version__
from crawlfleet.config import Settings
from crawlfleet.errors import CrawlfleetError, DecodeError, KafkaStageError
from schemas.codec import Codec, Headers, default_codec
from schemas.topics import Topology, partition_for

log = logging.getLogger("crawlfleet.runtime")


class FencedError(CrawlfleetError):
    """This worker no longer owns its transactional id or its partitions: drop and rejoin."""

    reason = "fenced"


class TxnAbortedError(KafkaStageError):
    """The transaction was aborted; the stage must rewind to its committed offsets."""

    reason = "txn_aborted"


@dataclass(frozen=True)
class Output:
    """One record to produce inside the stage's transaction."""

    topic: str
    partition: int
    key: bytes
    value: bytes | None
    headers: Headers


def topology_of(settings: Settings) -> Topology:
    return Topology(prefix=settings.topic_prefix, partitions=settings.topic_partitions,
                    replication=settings.replication,
                    seen_retention_ms=int(settings.seen_ttl_s * 1000))


def worker_name(stage: str, worker_id: str | None, slot_dir: Path | None = None) -> str:
    """The worker's id: the given one, else ``<host>-<stage>-<n>`` for the lowest free slot n.

    The id is the worker's transactional id and names its local state (the seen store), so a
    worker restarted without ``--worker-id`` should get its former id back -- fencing its old
    self at once and reopening its old store -- while two live workers must never share one.
    A slot is an flock on ``slot_dir/<stage>-<n>.lock``, released by the kernel when its
    holder dies. Without ``slot_dir`` the pid makes the id unique (not stable).
    """
    if worker_id:
        return worker_id
    host = socket.gethostname()
    if slot_dir is None:
        return f"{host}-{stage}-{os.getpid()}"
    slot_dir.mkdir(parents=True, exist_ok=True)
    for n in range(_MAX_SLOTS):
        fd = os.open(slot_dir / f"{stage}-{n}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        name = f"{host}-{stage}-{n}"
        _SLOTS[name] = fd  # held for the life of the process
        return name
    return f"{host}-{stage}-{os.getpid()}"


def release_worker_name(name: str) -> None:
    """Give a slot back before the process ends (tests; a process's exit does it anyway)."""
    fd = _SLOTS.pop(name, None)
    if fd is not None:
        os.close(fd)


_MAX_SLOTS = 256
_SLOTS: dict[str, int] = {}


def consumer_conf(settings: Settings, group: str, client_id: str) -> dict[str, Any]:
    return {
        **settings.kafka_common(),
        "group.id": group,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "session.timeout.ms": settings.session_timeout_ms,
        "heartbeat.interval.ms": max(1000, settings.session_timeout_ms // 10),
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        # range keeps partition N of frontier and frontier.high with the same owner.
        "partition.assignment.strategy": "range",
        "fetch.wait.max.ms": 100,
        "queued.max.messages.kbytes": 65536,
    }


def producer_conf(settings: Settings, client_id: str,
                  transactional_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {
        **settings.kafka_common(),
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        # Outputs go out when the transaction commits (a flush ignores linger.ms), so batches
        # can be large: fewer, better-compressed produce requests for the shared broker.
        "linger.ms": 50,
        "batch.size": 1024 * 1024,
        "compression.type": "lz4",
        "message.max.bytes": 16 * 1024 * 1024,
    }
    if transactional_id:
        conf["transactional.id"] = transactional_id
        # A worker that dies mid-transaction blocks read_committed readers until this
        # expires (or until it restarts with the same id and fences its old self).
        conf["transaction.timeout.ms"] = 15_000
    return conf


class TxnCommitter:
    """Owns a transactional producer: outputs + input offsets commit atomically, or not at all."""

    def __init__(self, settings: Settings, transactional_id: str, client_id: str) -> None:
        self.transactional_id = transactional_id
        self.producer = Producer(producer_conf(settings, client_id, transactional_id))
        self._run(lambda: self.producer.init_transactions(30))

    def commit(self, consumer: Consumer, outputs: Iterable[Output],
               offsets: list[TopicPartition]) -> None:
        """Produce ``outputs`` and commit ``offsets`` of ``consumer``'s group atomically."""
        self._run(self.producer.begin_transaction)
        try:
            for o in outputs:
                self._produce(o)
            if offsets:
                meta = consumer.consumer_group_metadata()
                self._run(lambda: self.producer.send_offsets_to_transaction(offsets, meta, 30))
            faults.point("before_commit")
            self._run(lambda: self.producer.commit_transaction(30))
            faults.point("after_commit")
        except TxnAbortedError:
            self._abort()
            raise

    def _produce(self, o: Output) -> None:
        while True:
            try:
                self.producer.produce(o.topic, value=o.value, key=o.key, partition=o.partition,
                                      headers=o.headers)
                return
            except BufferError:
                self.producer.poll(0.05)  # queue full: let deliveries drain
            except KafkaException as exc:
                raise _classify(exc) from exc

    def _abort(self) -> None:
        try:
            self.producer.abort_transaction(30)
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal():
                raise FencedError(f"abort failed fatally: {err}") from exc

    def _run(self, call: Callable[[], Any]) -> Any:
        for attempt in range(5):
            try:
                return call()
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.retriable() and not err.txn_requires_abort() and attempt < 4:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise _classify(exc) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        try:
            self.producer.flush(5)
        except KafkaException as exc:  # a fenced producer has nothing left worth flushing
            log.info("producer %s closed after: %s", self.transactional_id, exc)


def _classify(exc: KafkaException) -> CrawlfleetError:
    err: KafkaError = exc.args[0]
    if err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                     KafkaError.INVALID_PRODUCER_EPOCH):
        return FencedError(f"transaction fenced: {err.str()}")
    if err.txn_requires_abort():
        return TxnAbortedError(f"transaction must abort: {err.str()}")
    return KafkaStageError(f"kafka error: {err.str()}")


def consume_ready(consumer: Consumer, max_n: int, timeout: float) -> list[Message]:
    """Up to ``max_n`` records: wait up to ``timeout`` for the first, then take only what is
    already fetched.

    ``Consumer.consume(n, timeout)`` returns only when it has ``n`` records or the timeout
    has passed, so a lightly loaded stage would sit out the whole timeout on every call and
    add it to every hop of the crawl.
    """
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_n <= 1:
        return [first]
    return [first, *consumer.consume(max_n - 1, 0)]


def rewind(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Seek ``partitions`` back to their committed offsets (after an aborted transaction)."""
    if not partitions:
        return
    committed = consumer.committed(partitions, timeout=30)
    for tp in committed:
        offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
        consumer.seek(TopicPartition(tp.topic, tp.partition, offset))


def tp_of(msg: Message) -> tuple[str, int]:
    """(topic, partition) of a consumed record (never None for a record without error)."""
    topic, partition = msg.topic(), msg.partition()
    assert topic is not None and partition is not None
    return topic, partition


def offset_of(msg: Message) -> int:
    offset = msg.offset()
    assert offset is not None
    return offset


def job_key(target: str, profile: str, url: str) -> bytes:
    return f"{target}|{profile}|{url}".encode()


class Encoder:
    """Builds Outputs for the records crawlfleet produces, partitioned by target."""

    def __init__(self, topology: Topology, worker: str, codec: Codec | None = None) -> None:
        self.topology = topology
        self.codec = codec or default_codec()
        self.worker = worker

    def record(self, topic: str, record: str, target: str, key: bytes,
               value: dict[str, Any] | None) -> Output:
        part = partition_for(target, self.topology.partitions)
        if value is None:
            return Output(topic, part, key, None, [])
        payload, headers = self.codec.encode(record, value)
        return Output(topic, part, key, payload, headers)

    def job(self, topic: str, job: dict[str, Any]) -> Output:
        return self.record(topic, "CrawlJob", job["target"],
                           job_key(job["target"], job["profile"], job["url"]), job)

    def dead(self, job: dict[str, Any] | None, raw: bytes | None, source_topic: str,
             reason: str, error: str, attempts: int, target: str | None = None) -> Output:
        tgt = job["target"] if job else (target or "")
        key = job_key(tgt, job["profile"], job["url"]) if job else b"undecodable"
        return self.record(self.topology.dead, "DeadLetter", tgt, key, {
            "job": job, "raw": raw, "source_topic": source_topic, "reason": reason,
            "error": error[:2000], "attempts": attempts, "worker": self.worker,
            "version": __version__, "failed_at_ms": int(time.time() * 1000)})

    def decode(self, record: str, msg: Message) -> dict[str, Any]:
        return self.codec.decode(record, msg.value(), msg.headers())

    def undecodable(self, msg: Message, exc: DecodeError) -> Output:
        """Dead-letter a record no schema can read, keeping its bytes for inspection."""
        key = msg.key() or b""
        key_bytes = key.encode() if isinstance(key, str) else key
        target = key_bytes.split(b"|", 1)[0].decode("utf-8", "replace")
        return self.dead(None, raw_value(msg), tp_of(msg)[0], exc.reason, str(exc), 1, target)


def raw_value(msg: Message) -> bytes | None:
    value = msg.value()
    return value.encode() if isinstance(value, str) else value


class StopFlag:
    """Set by SIGTERM/SIGINT so loops finish their current step and leave the group cleanly."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self._event.set())
            signal.signal(signal.SIGINT, lambda *_: self._event.set())
        return self

    def set(self) -> None:
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


#: Status gauges that mean a worker still holds work: a pipeline is drained only when every
#: worker reports zero for each (jobs in flight, queued in memory, parked on disk, waiting in
#: the timer store, or partitions held back).
HOLDING_GAUGES = ("inflight", "queued", "parked", "timers", "held_partitions")


def holds_work(gauges: dict[str, Any]) -> dict[str, Any]:
    """The holding gauges of a status that are non-zero (empty: holds nothing)."""
    return {k: gauges[k] for k in HOLDING_GAUGES if gauges.get(k)}


class StatusFile:
    """Writes a worker's counters to ``status_dir`` so the CLI can show progress and drain."""

    def __init__(self, status_dir: Path, stage: str, worker: str) -> None:
        status_dir.mkdir(parents=True, exist_ok=True)
        self.path = status_dir / f"{stage}-{worker}.json"
        self.stage = stage
        self.worker = worker
        self.counters: dict[str, int] = {}
        self.gauges: dict[str, int] = {}
        self._last_write = 0.0
        self._last_activity = time.monotonic()

    def add(self, name: str, n: int = 1) -> None:
        if n:
            self.counters[name] = self.counters.get(name, 0) + n
            self._last_activity = time.monotonic()

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_write < 0.5:
            return
        self._last_write = now
        data = {"stage": self.stage, "worker": self.worker, "pid": os.getpid(),
                "counters": self.counters, "gauges": self.gauges,
                "idle_s": round(now - self._last_activity, 3), "wall": time.time()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def read_statuses(status_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(status_dir.glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue  # being replaced right now
    return out
