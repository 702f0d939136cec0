"""Dedupe state per owned partition, restored from the compacted ``crawl.seen`` changelog.

The fetch stage owns a target's frontier partition and the same-numbered ``crawl.seen``
partition; it writes every state change to ``crawl.seen`` inside the transaction that
commits the work, so after a crash or rebalance the next owner restores exactly the
committed state (read_committed) and a redelivered job is recognised by its semantic key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from consumers.runtime import raw_value, tp_of
from crawlfleet.config import Settings
from schemas.codec import Codec, HeadersIn

log = logging.getLogger("crawlfleet.seen")

DONE, RETRYING, DEAD = "DONE", "RETRYING", "DEAD"


class SeenStore:
    """key (profile|canonical URL) → (state, attempt), held per partition."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self._parts: dict[int, dict[str, tuple[str, int]]] = {}

    def partitions(self) -> set[int]:
        return set(self._parts)

    def get(self, partition: int, key: str) -> tuple[str, int] | None:
        return self._parts.get(partition, {}).get(key)

    def put_many(self, items: Iterable[tuple[int, str, str, int]]) -> None:
        """Apply committed changes: (partition, key, state, attempt)."""
        for partition, key, state, attempt in items:
            part = self._parts.get(partition)
            if part is not None:  # a partition revoked meanwhile is not ours to keep
                part[key] = (state, attempt)

    def close(self) -> None:
        self._parts.clear()

    def drop(self, partition: int) -> None:
        self._parts.pop(partition, None)

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts.values())

    def restore(self, settings: Settings, topic: str, partitions: list[int],
                codec: Codec, timeout_s: float = 120.0) -> int:
        """Load the committed state of ``partitions`` from the changelog; returns keys read."""
        todo = [p for p in partitions if p not in self._parts]
        if not todo:
            return 0
        for p in todo:
            self._parts[p] = {}
        conf = {**settings.kafka_common(), "group.id": "crawlfleet-seen-restore",
                "enable.auto.commit": False, "isolation.level": "read_committed",
                "enable.partition.eof": True, "auto.offset.reset": "earliest"}
        consumer = Consumer(conf)
        n = 0
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in todo])
            pending = set(todo)
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.5):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            pending.discard(tp_of(msg)[1])
                        continue
                    n += self._apply(tp_of(msg)[1], msg.key(), raw_value(msg),
                                     msg.headers(), codec)
            if pending:
                log.warning("seen restore of %s incomplete after %ss", pending, timeout_s)
        finally:
            consumer.close()
        return n

    def _apply(self, partition: int, key: str | bytes | None, value: bytes | None,
               headers: HeadersIn, codec: Codec) -> int:
        if key is None:
            return 0
        k = key.decode() if isinstance(key, bytes) else key
        if value is None:
            self._parts[partition].pop(k, None)
            return 1
        rec = codec.decode("Seen", value, headers)
        self._parts[partition][k] = (rec["state"], rec["attempt"])
        return 1
