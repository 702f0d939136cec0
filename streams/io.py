"""Kafka client plumbing every layer above ``infra`` shares: records, client configs, reads.

What travels (:class:`Output`, built by the :class:`Encoder` from the topology and the Avro
codec) and how clients are configured and read, with no stage logic: producers, the stages
and the CLI all build on it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
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

from core import __version__
from core.config import Settings
from core.errors import CrawlfleetError, DecodeError, KafkaStageError, UndeclaredTopicError
from schemas.codec import Codec, Headers, R, default_codec
from schemas.keys import job_key
from schemas.records import Control, CrawlJob, DeadLetter
from schemas.stages import stage_spec
from schemas.topics import Topology, partition_for


class FencedError(CrawlfleetError):
    """This worker no longer owns its transactional id or its partitions: drop and rejoin."""

    reason = "fenced"


class StaleMembershipError(KafkaStageError):
    """The session ended while its group was rebalancing (a cooperative rebalance's first
    round done, this member's rejoin for the second not yet sent). A static member that
    rejoins under the same instance id is then handed its former assignment back with no
    second round, and the partitions it was giving up go to nobody until the group's next
    rebalance. The stage therefore leaves the group by instance id before it rejoins (a
    fresh join: the assignor places every partition). Never raised for a fencing: the
    instance id may then be a newer twin's, which a leave would evict."""

    reason = "stale_membership"


class HandOverError(StaleMembershipError):
    """The commit handing finished work over as partitions were revoked failed."""

    reason = "handover"


@dataclass(frozen=True)
class Output:
    """One record to produce inside the stage's transaction."""

    topic: str
    partition: int
    key: bytes
    value: bytes | None
    headers: Headers




#: Heartbeats (classic protocol) are how a member learns a rebalance has begun: each of the
#: two rounds of a cooperative rebalance waits for up to one interval.
HEARTBEAT_MS = 1000
#: The longest an empty fetch of a stage's consumer waits at the broker (see consumer_conf).
IDLE_FETCH_WAIT_MS = 500


def consumer_conf(settings: Settings, group: str, worker: str) -> dict[str, Any]:
    """A stage's group consumer: static member ``worker``, incremental (cooperative) rebalances.

    The worker id is also the ``group.instance.id`` (KIP-345): a worker killed and restarted
    under its id within the session timeout gets its partitions back with no rebalance, and
    its new self fences the old one at once. The price: a static member that stops and does
    not come back holds its partitions until the session timeout expires (a clean stop
    sends no LeaveGroup either). ``cooperative-sticky`` (KIP-429) moves only the partitions
    that change owner; the others keep flowing. Topics that must share an owner are not left
    to the assignor: see :meth:`schemas.topics.Topology.subscription`.

    Measured against the broker-side protocol of KIP-848 (``group.protocol=consumer``) on
    Kafka 4.1: there a static member killed -9 cannot rejoin until its session expires
    (UNRELEASED_INSTANCE_ID, fatal in librdkafka 2.16), so every crash would stall its
    partitions for the session timeout (45 s by default).
    """
    session = settings.session_timeout_ms
    return {
        **settings.kafka_common(),
        "group.id": group,
        "client.id": worker,
        "group.instance.id": worker,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "session.timeout.ms": session,
        "heartbeat.interval.ms": max(100, min(HEARTBEAT_MS, session // 3)),
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "partition.assignment.strategy": "cooperative-sticky",
        # How long the broker holds an empty fetch: records arriving end it at once (a
        # transaction's markers too), so it costs an idle stage wake-ups, not a busy one
        # latency. At 100 ms each stage's consumer asked 10 times a second while idle, and
        # those empty fetches were most of an idle fleet's broker CPU (issue 43). A
        # partition resumed while a fetch is held joins the next one: up to this long.
        "fetch.wait.max.ms": IDLE_FETCH_WAIT_MS,
        "queued.max.messages.kbytes": 65536,
    }


#: How long a new producer waits to reach its cluster before its first request of its own.
PRODUCER_REACH_S = 2.0


def connected_producer(conf: dict[str, Any]) -> Producer:
    """A producer that has reached its cluster (one metadata request) before it needs a
    producer id: librdkafka retries an idempotence or transaction request that found no
    broker connected yet only after a fixed 0.5 s. Measured on fresh producers: the first
    delivery of an idempotent one took 0.5 s in 6 of 6 tries, 0.06 s in 5 of 6 after the
    request; ``init_transactions`` through a commit took 0.5 s in 1 of 6, 0 of 6 after it.
    A cluster that does not answer is left to the producer's own calls to report."""
    producer = Producer(conf)
    with contextlib.suppress(KafkaException):
        producer.list_topics(timeout=PRODUCER_REACH_S)
    return producer


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
        conf["transaction.timeout.ms"] = transaction_timeout_ms(settings)
        # librdkafka 2.10+ drops brokers missing from a metadata response (all of them, for
        # a moment, when the whole cluster restarts), and a group coordinator cached on a
        # dropped broker is not looked up again until another broker changes state, while
        # send_offsets_to_transaction ignores its timeout meanwhile (librdkafka#5456,
        # #5511): the stage's polling thread stood still until the next metadata refresh,
        # 5 min by default. A refresh every few seconds brings the brokers, and with them
        # the coordinator lookup, back within seconds of the cluster's return.
        conf["topic.metadata.refresh.interval.ms"] = TXN_METADATA_REFRESH_MS
    return conf


#: How often a transactional producer refreshes its metadata (see producer_conf).
TXN_METADATA_REFRESH_MS = 5000


def transaction_timeout_ms(settings: Settings) -> int:
    """The session timeout: the longest a transaction may stay open.

    Two costs pull against each other. A worker that dies mid-transaction blocks
    read_committed readers and the next owner's restore until it expires (or until it
    restarts under its id and fences its old self): at most the session timeout keeps that
    within the lease the group grants anyway. librdkafka also caps the producer's message
    and socket timeouts by it, so a short one turns a slow broker into an aborted batch
    (the former 15 s did, for any broker pause past 15 s). The session timeout is
    the pause the group already rides out without a rebalance, so a transaction does too.
    """
    return settings.session_timeout_ms


def consume_ready(consumer: Consumer, max_n: int, timeout: float) -> list[Message]:
    """Up to ``max_n`` records: wait up to ``timeout`` for the first, then take only what is
    already fetched.

    ``Consumer.consume(n, timeout)`` returns only when it has ``n`` records or the timeout
    has passed, so a lightly loaded stage would sit out the whole timeout on every call and
    add it to every hop of the crawl.

    A fatal consumer error ends the consumer (librdkafka delivers it once, then nothing
    ever again): raised as :class:`FencedError`, so the stage drops its session and rejoins
    with a new consumer instead of polling a dead one forever. A static member gets one
    when the group has taken its ``group.instance.id`` for a newer join -- which a join
    retried across a whole-cluster restart can do to a live worker.
    """
    first = consumer.poll(timeout)
    if first is None:
        return []
    msgs = [first] if max_n <= 1 else [first, *consumer.consume(max_n - 1, 0)]
    for msg in msgs:
        err = msg.error()
        # The event's code is _FATAL; its own fatal() flag is False (measured, 2.16).
        if err is not None and (err.fatal() or err.code() == KafkaError._FATAL):
            raise FencedError(f"consumer: {err.str()}")
    return msgs


def stable_committed(settings: Settings, group: str,
                     partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """``group``'s committed offset per partition (-1001: none), read as *stable* offsets.

    A ``read_committed`` client asks for stable offsets (KIP-447): the read waits until a
    former owner's pending transactional offsets are committed or aborted, so whatever that
    transaction wrote to a changelog is settled before a restore reads it.
    """
    reader = Consumer({**settings.kafka_common(), "group.id": group,
                       "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        return {(tp.topic, tp.partition): tp.offset
                for tp in reader.committed(partitions, timeout=30)}
    finally:
        reader.close()


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


class Encoder:
    """Builds Outputs for the records crawlfleet produces, partitioned by target."""

    def __init__(self, topology: Topology, worker: str, codec: Codec | None = None,
                 outputs: frozenset[str] | None = None) -> None:
        self.topology = topology
        self.codec = codec or default_codec()
        self.worker = worker
        #: The topics a stage declared it writes (None: a publisher or a tool, unchecked).
        self.outputs = outputs

    @classmethod
    def of_stage(cls, topology: Topology, stage: str, worker: str,
                 codec: Codec | None = None) -> Encoder:
        """A stage's encoder: it writes only the topics ``stage`` declares (its outputs and
        its stores' changelogs), so the drawn topology is the one that runs."""
        allowed = {*topology.outputs(stage), *(topology.prefix + t
                                               for t in stage_spec(stage).changelogs)}
        return cls(topology, worker, codec, frozenset(allowed))

    def _check(self, topic: str) -> None:
        if self.outputs is not None and topic not in self.outputs:
            raise UndeclaredTopicError(f"{self.worker} wrote {topic}, which its stage does "
                                       "not declare among its outputs")

    def record(self, topic: str, target: str, key: bytes,
               value: Mapping[str, Any] | None) -> Output:
        """A record for ``topic``, of the type the topology declares for it, on its target's
        partition (a tombstone when ``value`` is None)."""
        self._check(topic)
        part = partition_for(target, self.topology.partitions)
        if value is None:
            return Output(topic, part, key, None, [])
        payload, headers = self.codec.encode(self.topology.record_of(topic), value)
        return Output(topic, part, key, payload, headers)

    def control(self, key: str, value: Control | None) -> Output:
        """A record for the single-partition control topic (a tombstone when None)."""
        topic = self.topology.control
        self._check(topic)
        if value is None:
            return Output(topic, 0, key.encode(), None, [])
        payload, headers = self.codec.encode(self.topology.record_of(topic), value)
        return Output(topic, 0, key.encode(), payload, headers)

    def job(self, topic: str, job: CrawlJob) -> Output:
        return self.record(topic, job["target"],
                           job_key(job["target"], job["profile"], job["url"]), job)

    def dead(self, job: CrawlJob | None, raw: bytes | None, source_topic: str,
             reason: str, error: str, attempts: int, target: str | None = None) -> Output:
        tgt = job["target"] if job else (target or "")
        key = job_key(tgt, job["profile"], job["url"]) if job else b"undecodable"
        letter: DeadLetter = {
            "job": job, "raw": raw, "source_topic": source_topic, "reason": reason,
            "error": error[:2000], "attempts": attempts, "worker": self.worker,
            "version": __version__, "failed_at_ms": int(time.time() * 1000)}
        return self.record(self.topology.dead, tgt, key, letter)

    def decode(self, msg: Message) -> dict[str, Any]:
        """A consumed record, read as the type its topic carries."""
        return self.codec.decode(self.topology.record_of(tp_of(msg)[0]), msg.value(),
                                 msg.headers())

    def decode_as(self, kind: type[R], msg: Message) -> R:
        """A consumed record as the TypedDict ``kind`` of :mod:`schemas.records`, so its
        keys are checked: a stage names what its input topic carries (a record of another
        type is a :class:`DecodeError`, as the codec checks the writer's record)."""
        return self.codec.decode_as(kind, msg.value(), msg.headers())

    def decode_job(self, msg: Message) -> CrawlJob:
        """A consumed frontier, retry or parked record."""
        return self.decode_as(CrawlJob, msg)

    def undecodable(self, msg: Message, exc: DecodeError) -> Output:
        """Dead-letter a record no schema can read, keeping its bytes for inspection."""
        key = msg.key() or b""
        key_bytes = key.encode() if isinstance(key, str) else key
        target = key_bytes.split(b"|", 1)[0].decode("utf-8", "replace")
        return self.dead(None, raw_value(msg), tp_of(msg)[0], exc.reason, str(exc), 1, target)


def raw_value(msg: Message) -> bytes | None:
    value = msg.value()
    return value.encode() if isinstance(value, str) else value
