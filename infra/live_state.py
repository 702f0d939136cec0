"""Live entries of a compacted state changelog, as the broker holds them.

"Drained" must be read from the broker, never from a worker's gauges: a job parked on disk
or waiting in a timer store is work even when no worker has it in memory (a worker that
restored it may have died, or dropped it). This reads a changelog (``crawl.parked``,
``crawl.timers``) from its start to its end with a ``read_committed`` consumer and counts,
per partition, the keys whose latest committed value is not a tombstone.

It waits for the end of each partition to be *stable*: the last stable offset equals the
high watermark, i.e. no transaction is still open on it. A read that stops at the LSO while
a transaction is open would miss that transaction's writes (or tombstones) and report a
count that is about to change; an open transaction is itself work in progress, so the count
reports ``unsettled`` instead of guessing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from core.config import Settings
from core.errors import InfraError


@dataclass
class LiveEntries:
    """Per-partition live keys of one changelog; ``unsettled`` partitions had an open
    transaction (or could not be read to their end) when counted."""

    topic: str
    counts: dict[int, int] = field(default_factory=dict)
    keys: dict[int, set[bytes]] = field(default_factory=dict)
    unsettled: set[int] = field(default_factory=set)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def settled(self) -> bool:
        return not self.unsettled


def _reader_conf(settings: Settings) -> dict[str, object]:
    return {**settings.kafka_common(), "group.id": f"crawlfleet-live-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "enable.partition.eof": True, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10}


def live_entries(settings: Settings, topic: str, partitions: int,
                 timeout_s: float = 10.0) -> LiveEntries:
    """Count the live (non-tombstone) keys of each of ``partitions`` partitions of ``topic``.

    Raises :class:`InfraError` when the broker cannot be asked at all; a partition that could
    not be read to a stable end within ``timeout_s`` is listed in ``unsettled``.
    """
    reader = LiveReader(settings)
    try:
        return reader.read(topic, partitions, timeout_s)
    finally:
        reader.close()


class LiveReader:
    """Reads changelogs' live entries again and again (a sampler's), with the same two
    clients: a new admin client and consumer for every read, three changelogs every 10 s,
    were most of an idle store worker's CPU and of the broker's connection set-ups
    (issue 43). A changelog whose ends have not moved since its last settled read is not
    read again: a compacted topic changes only by appends (records, tombstones, markers),
    so its live keys are the ones counted then."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self._last: dict[str, tuple[dict[int, int], LiveEntries]] = {}

    def read(self, topic: str, partitions: int, timeout_s: float = 10.0) -> LiveEntries:
        """As :func:`live_entries`; an unchanged changelog is answered by one request."""
        if self._admin is None:
            self._admin = AdminClient(self.s.kafka_common())
        ends = high_watermarks(self.s, topic, range(partitions), timeout_s, self._admin)
        last = self._last.get(topic)
        if last is not None and last[0] == ends:
            return last[1]
        out = self._read(topic, ends, timeout_s)
        if out.settled:
            self._last[topic] = (ends, out)
        else:
            self._last.pop(topic, None)
        return out

    def _read(self, topic: str, ends: dict[int, int], timeout_s: float) -> LiveEntries:
        assert self._admin is not None
        out = LiveEntries(topic, counts={p: 0 for p in ends}, keys={p: set() for p in ends})
        todo = {p for p, high in ends.items() if high > 0}
        if not todo:
            return out
        # From each log start as an offset, not OFFSET_BEGINNING: a new client's lookup of
        # a logical offset waits out librdkafka's offset-query back-off (~0.5 s measured).
        starts = high_watermarks(self.s, topic, sorted(todo), timeout_s, self._admin,
                                 low=True)
        if self._consumer is None:
            self._consumer = Consumer(_reader_conf(self.s))
        consumer = self._consumer
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(todo)])
        try:
            live: dict[int, dict[bytes, bool]] = {p: {} for p in todo}
            reached: dict[int, int] = {}
            deadline = time.monotonic() + timeout_s
            while todo - set(reached) and time.monotonic() < deadline:
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                part = msg.partition()
                assert part is not None
                if msg.topic() != topic or part not in todo:
                    continue  # left from an earlier read's assignment
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # Under read_committed the EOF is at the LSO: stable only if it is
                        # the high watermark (no open transaction on this partition).
                        reached[part] = msg.offset() or 0
                    continue
                key = msg.key()
                if key is None:
                    continue
                k = key.encode() if isinstance(key, str) else key
                live[part][k] = msg.value() is not None
        finally:
            consumer.unassign()
        for p in todo:
            at = reached.get(p)
            if at is None:
                out.unsettled.add(p)
                continue
            if at < ends[p]:
                out.unsettled.add(p)  # an open transaction: work whose fate is not known yet
            keys = {k for k, alive in live[p].items() if alive}
            out.keys[p] = keys
            out.counts[p] = len(keys)
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None
        self._last.clear()


#: Refusals that a moment cures, though librdkafka's admin client does not mark them
#: retriable: the partition's leader is not known (yet) where the request went.
_LEADER_UNKNOWN = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION,
                             KafkaError.LEADER_NOT_AVAILABLE})


def high_watermarks(settings: Settings, topic: str, partitions: Iterable[int],
                    timeout_s: float = 10.0, admin: AdminClient | None = None,
                    low: bool = False) -> dict[int, int]:
    """The high (``low``: the low) watermark of each partition, in one request
    (read_uncommitted: a ``read_committed`` client's watermark is the last stable offset
    instead).

    A retriable refusal (a partition whose leader the broker does not know yet, e.g. just
    after the topic was created or while a leader moves) is asked again until
    ``timeout_s``."""
    admin = admin if admin is not None else AdminClient(settings.kafka_common())
    spec = OffsetSpec.earliest() if low else OffsetSpec.latest()  # type: ignore[no-untyped-call]
    asked = {TopicPartition(topic, p): spec for p in partitions}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            futures = admin.list_offsets(asked, isolation_level=IsolationLevel.READ_UNCOMMITTED,
                                         request_timeout=timeout_s)
            return {tp.partition: f.result().offset for tp, f in futures.items()}
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            again = err.retriable() or err.code() in _LEADER_UNKNOWN
            if not again or time.monotonic() >= deadline:
                raise InfraError(f"cannot read the end of {topic}: {exc}") from exc
            time.sleep(0.1)
