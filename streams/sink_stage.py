"""The sink runtime: consume a batch, write it idempotently, then commit its offsets (store).

A sink's output leaves Kafka (ClickHouse), so no Kafka transaction can cover it: the write
must be idempotent on replay, and the offsets are committed only after it returned. A crash
between the two replays the batch, which the sink recognises (deduplication token, a
replacing merge). Batches are cut by size and time and cut short when the input goes quiet
(unless it trickles: ``streams.trickle``).
Records the sink itself must add to a topic (its dead letters) are produced and awaited
before the offsets move (:meth:`SinkStage.publish`).
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from core.config import Settings
from core.errors import KafkaStageError
from schemas.codec import Codec
from streams.idle_poll import IdlePoll
from streams.io import (
    Output,
    connected_producer,
    consume_ready,
    consumer_conf,
    producer_conf,
    rewind,
    tp_of,
)
from streams.membership import Membership
from streams.stage import Stage
from streams.trickle import Trickle
from streams.worker import StopFlag

log = logging.getLogger("crawlfleet.sink")

#: How long an idle sink's poll waits for a record (its stop is seen within it).
IDLE_POLL_S = 0.05

class SinkStage(Stage):
    """A stage whose session writes each batch out of Kafka, then commits its offsets."""

    def __init__(self, settings: Settings, worker_id: str | None = None,
                 stop: StopFlag | None = None, codec: Codec | None = None) -> None:
        super().__init__(settings, worker_id, stop, codec)
        self._committed: dict[tuple[str, int], int] = {}
        self._revoked: set[tuple[str, int]] = set()
        self._producer: Producer | None = None  # made for the first record to publish
        self._idle = IdlePoll()
        self.trickle = Trickle(self.trickle_linger_s())

    @abstractmethod
    def write(self, batch: list[Message]) -> dict[tuple[str, int], int]:
        """Write ``batch`` idempotently; the next offset of each partition it covered."""

    def batch_limits(self) -> tuple[int, float, float]:
        """(most records per write, longest wait after a batch's first record, the gap
        with no new record that cuts the batch short)."""
        return 1000, 0.5, 0.05

    def trickle_linger_s(self) -> float:
        """How long a batch gathers while the input trickles (``streams.trickle``; 0: no
        lingering, every quiet gap cuts a batch)."""
        return 0.0

    def session(self) -> None:
        """One consumer's life in the group: collect, write, commit, until stopped."""
        self._committed.clear()
        self._revoked.clear()
        consumer = Consumer(consumer_conf(self.settings, self.topology.group(self.stage),
                                          self.worker))
        Membership(self.topology, self.stage).subscribe(consumer, on_revoke=self._on_revoke,
                                                         report=self.status)
        try:
            while not self.stop.requested:
                self.approval.check()  # revoked: leave between writes, all committed
                batch = self._collect(consumer)
                if self._revoked:
                    # Moved while collecting (only those partitions: rebalances are
                    # incremental): the new owner writes them, from the committed offset.
                    batch = [m for m in batch if tp_of(m) not in self._revoked]
                    owned = {(p.topic, p.partition) for p in consumer.assignment()}
                    # One revoked and assigned again: re-read it from its committed offset.
                    rewind(consumer, [TopicPartition(t, p) for t, p in self._revoked & owned])
                    self._revoked.clear()
                offsets = self.write(batch) if batch else {}
                # Written, offsets not committed yet: rows a crash now would write again
                # (dropped by the deduplication token only if the replay batches alike).
                self.status.gauges["uncommitted"] = self.status.gauges.get(
                    "uncommitted", 0) + len(batch)
                self._commit(consumer, offsets)
                self.status.write()
        finally:
            consumer.close()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            self._revoked.add((p.topic, p.partition))
            self._committed.pop((p.topic, p.partition), None)

    def _collect(self, consumer: Consumer) -> list[Message]:
        """Records for one write: at most the batch's rows, gathered for at most its wait
        after the first one, and cut short when the input goes quiet (then nothing more is
        coming soon and waiting would only delay the results)."""
        batch: list[Message] = []
        rows, wait_s, quiet_s = self.batch_limits()
        deadline: float | None = None
        wait_s = self.trickle.wait_s(wait_s)
        while len(batch) < rows and not self.stop.requested:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            # Idle: a short poll, so a stop is seen within IDLE_POLL_S (the crawl stops
            # the store last, after everything else, and waits for it); long idle, a
            # longer one (streams.idle_poll). Trickling: a poll to the deadline, in
            # pieces short enough to see a stop.
            quiet = quiet_s if self.trickle.cuts_on_quiet(len(batch)) else IDLE_POLL_S * 4
            timeout = self._idle.timeout(IDLE_POLL_S, holding=False) if deadline is None \
                else min(deadline - now, quiet)
            got = False
            self.poll_gaps.tick()
            for msg in consume_ready(consumer, min(1000, rows - len(batch)), timeout):
                err = msg.error()
                if err is None:
                    batch.append(msg)
                    got = True
                    self._idle.took()
                elif err.code() != KafkaError._PARTITION_EOF:
                    log.warning("%s consume error: %s", self.stage, err)
            if got and deadline is None:
                deadline = now + wait_s
            elif not got:
                if batch and self.trickle.cuts_on_quiet(len(batch)):
                    break
                if not batch:
                    self.status.write()
        self.trickle.ended(len(batch))
        return batch

    def _commit(self, consumer: Consumer, offsets: dict[tuple[str, int], int]) -> None:
        """Commit what was written, and positions past transaction markers when idle."""
        for pos in consumer.position(consumer.assignment()):
            key = (pos.topic, pos.partition)
            if pos.offset > offsets.get(key, -1):
                offsets[key] = pos.offset
        changed = {k: o for k, o in offsets.items() if self._committed.get(k) != o}
        if not changed:
            self.status.gauges["uncommitted"] = 0
            return
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in changed.items()],
                            asynchronous=False)
            self._committed.update(changed)
            self.status.gauges["uncommitted"] = 0
        except KafkaException as exc:  # rebalanced meanwhile: the batch will be replayed
            log.warning("%s offset commit failed, batch will be replayed: %s", self.stage, exc)

    def publish(self, outputs: list[Output]) -> None:
        """Produce ``outputs`` and wait until the broker has them all (else raise: the
        batch's offsets must not be committed; the session ends and the batch is replayed)."""
        if self._producer is None:
            self._producer = connected_producer(producer_conf(self.settings, self.worker))
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(err)

        for out in outputs:
            self._producer.produce(out.topic, value=out.value, key=out.key,
                                   partition=out.partition, headers=out.headers,
                                   on_delivery=delivered)
        left = self._producer.flush(30)
        if left or failed:
            raise KafkaStageError(f"{self.stage}: {left} records undelivered, "
                                  f"{len(failed)} failed ({failed[:1]})")
