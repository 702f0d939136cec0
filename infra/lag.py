"""Queue depth: how far each stage's consumer group is behind its input topics."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition

from crawlfleet.config import Settings


class LagProbe:
    """Reads committed offsets and high watermarks; one client reused across calls."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._consumers: dict[str, Consumer] = {}

    def lag(self, group: str, topics: list[str], partitions: int) -> int:
        """Records not yet committed by ``group`` (transaction markers count as one each)."""
        c = self._consumers.get(group)
        if c is None:
            c = self._consumers[group] = Consumer({**self._settings.kafka_common(),
                                                   "group.id": group,
                                                   "enable.auto.commit": False})
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        try:
            committed = c.committed(tps, timeout=10)
        except KafkaException:
            return -1
        total = 0
        for tp in committed:
            try:
                low, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
            except KafkaException:
                continue
            start = tp.offset if tp.offset >= 0 else low
            total += max(0, high - start)
        return total

    def close(self) -> None:
        for c in self._consumers.values():
            c.close()
        self._consumers.clear()
