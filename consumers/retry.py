"""Retry scheduler: holds jobs in ``crawl.retry.<delay>`` tiers, then re-enqueues them.

Delays are measured without trusting this worker's wall clock: the first record seen in a
partition anchors broker time (LogAppendTime) to the local monotonic clock, and later
records are due at anchor + (their broker time - anchor broker time) + delay. A restart
re-anchors, which can only make a job wait longer, never shorter.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Message, TopicPartition

from consumers.batch_stage import BatchStage, NotDueError
from consumers.runtime import Output, tp_of
from schemas.topics import RETRY_DELAYS_S


class RetryStage(BatchStage):
    stage = "retry"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delay_of = {self.topology.retry(d): float(d) for d in RETRY_DELAYS_S}
        self._anchor: dict[tuple[str, int], tuple[int, float]] = {}

    def input_topics(self) -> list[str]:
        return self.topology.retry_topics

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        super()._on_assign(consumer, partitions)
        self._anchor.clear()

    def handle(self, msg: Message) -> list[Output]:
        job = self.encoder.decode("CrawlJob", msg)
        key = tp_of(msg)
        wait = max(self._delay_of.get(key[0], 0.0), job.get("delay_ms", 0) / 1000.0)
        remaining = self._due_in(msg, wait)
        if remaining > 0:
            self.status.gauges["waiting"] = 1
            raise NotDueError(remaining)
        self.status.gauges["waiting"] = 0
        topic = self.topology.frontier_high if job.get("priority", 0) > 0 \
            else self.topology.frontier
        return [self.encoder.job(topic, {**job, "delay_ms": 0})]

    def _due_in(self, msg: Message, wait_s: float) -> float:
        _, ts_ms = msg.timestamp()
        now = time.monotonic()
        key = tp_of(msg)
        anchor = self._anchor.setdefault(key, (ts_ms, now))
        arrived = anchor[1] + (ts_ms - anchor[0]) / 1000.0
        return arrived + wait_s - now
