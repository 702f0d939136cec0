"""Restore-on-assign: the Kafka side of a stage whose state is owned per partition.

A stage that keeps state per partition (the fetch stage's dedupe and parked stores, the retry
stage's timers) must not use a partition before its store holds the committed state, and must
then read the partition from the group's committed offsets. Both session runtimes that serve
such a stage (:mod:`streams.async_session`, :mod:`streams.batch_stage`) do it with a
:class:`PartitionRestore`:

- on assign, the new partitions (every input of each: :class:`~streams.membership.Membership`
  hands over the lead topic's partition N with its followers' N) pause, and their restore
  starts on the :class:`~streams.restorer.Restorer`'s thread: the partitions already owned
  keep flowing, and the rebalance callback returns at once;
- a finished restore's complete partitions are sought to the group's committed offsets
  (OFFSET_BEGINNING where the group has none): records polled before the pause took hold
  were dropped, not handled, so they are read again; the runtime seeds its commit
  bookkeeping with the same offsets and resumes the partitions;
- each finished restore is counted (``restores``, ``restore_failures``, the restore
  duration metric) and logged; a failed one keeps its partitions paused and waiting, and the
  Restorer tries it again;
- a revoke cancels the restore of the partitions that move: its result is discarded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from core.config import Settings
from streams.io import stable_committed
from streams.membership import Membership
from streams.restorer import RETRY_S, Restored, Restorer
from streams.status import StatusFile

TP = tuple[str, int]
#: The longest poll of a runtime while one of its restores runs (then it is collected).
RESTORE_POLL_S = 0.02
#: Restores ``parts`` on the restorer's thread: (the partitions that failed, the group's
#: committed offset of every input partition of ``parts``, what else the stage wants back).
RestoreParts = Callable[[set[int]], tuple[set[int], dict[TP, int], Any]]


@dataclass(frozen=True)
class RestoreSpec:
    """How a stage's restores run and read in its log: the restorer's name (its thread, its
    own log lines), how soon a failed restore is tried again, the logger of the runtime's
    lines and their words (``<stage> <worker>: <restored> [1, 2] restored in 0.12 s``,
    ``<stage> <worker>: <failed> [3] could not be restored (why); <then>``)."""

    name: str
    retry_s: float = RETRY_S
    log: str = "crawlfleet.stage"
    restored: str = "partitions"
    failed: str = "state of partitions"
    then: str = "they stay paused and are retried"


class PartitionRestore:
    """One stage's restore-on-assign: pause, restore off the poll thread, seek, report.

    Every call but ``restore`` (run on the restorer's thread) belongs on the thread that
    polls the consumer, where rebalance callbacks run.
    """

    def __init__(self, spec: RestoreSpec, stage: str, worker: str, status: StatusFile,
                 membership: Membership, restore: RestoreParts) -> None:
        if len(membership.topics) > 1:
            # Partition N's state must come with every input's N: make the others followers.
            raise ValueError(f"{stage}: partition-owned state needs one lead input, not "
                             f"{membership.topics}")
        self.spec, self.stage, self.worker, self.status = spec, stage, worker, status
        self.membership = membership
        self.inputs = [membership.lead, *membership.followers]
        self._restore_parts = restore
        self._log = logging.getLogger(spec.log)
        self.restorer = Restorer(spec.name, self._restore, spec.retry_s)

    def _restore(self, parts: set[int]) -> tuple[set[int], Any]:
        failed, offsets, info = self._restore_parts(parts)
        return failed, (offsets, info)

    def committed_offsets(self, settings: Settings, group: str,
                          parts: set[int]) -> dict[TP, int]:
        """Restorer thread: ``group``'s committed offset of every input partition of
        ``parts`` (-1001: none), read as stable offsets, so a former owner's pending
        transaction, and what it wrote to a changelog, is settled before a restore reads it."""
        return stable_committed(settings, group, self.membership.expand(
            [TopicPartition(self.membership.lead, p) for p in sorted(parts)]))

    # --- the polling thread -----------------------------------------------------------------

    @property
    def waiting(self) -> set[int]:
        """Partition numbers assigned but not usable yet (restoring, or failed)."""
        return self.restorer.waiting

    def poll_timeout(self, idle_s: float) -> float:
        """How long the runtime's next poll may wait: ``idle_s``, or ``RESTORE_POLL_S``
        while a restore runs (a poll cannot be woken, and a finished restore's partitions
        are resumed only by the next one: up to ``idle_s`` late, measured 0.1 s on
        average, for every new partition's first record)."""
        if self.restorer.running():
            return min(idle_s, RESTORE_POLL_S)
        return idle_s

    @property
    def failing(self) -> set[int]:
        """Partition numbers whose last restore failed (they wait for its retry)."""
        return self.restorer.failing

    def unusable(self) -> set[TP]:
        """Every input partition of the partitions waiting for their restore."""
        waiting = self.restorer.waiting
        return {(t, p) for t in self.inputs for p in waiting}

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """New ``partitions`` (every input of each, already assigned) pause until their
        state is restored, on the restorer's thread, never in this callback."""
        consumer.pause(partitions)
        self.restorer.start({p.partition for p in partitions})

    def revoked(self, partitions: list[TopicPartition]) -> None:
        """``partitions`` move: whatever their restore returns is discarded."""
        self.restorer.cancel({p.partition for p in partitions})

    def finished(self) -> list[Restored]:
        """Restores finished since the last call (failed ones due again are restarted)."""
        return self.restorer.finished()

    def seek(self, consumer: Consumer, done: Restored,
             resume: bool = True) -> tuple[list[TopicPartition], dict[TP, int], Any]:
        """Seek every input partition of ``done``'s complete partitions to the group's
        committed offset (OFFSET_BEGINNING: none), resuming them first if ``resume``.
        Records polled before the pause took hold were dropped, not handled: they are read
        again. Returns those partitions, their committed offsets (-1: none) and the stage's
        info.

        Resume comes before the seek: a resume bumps the partition's op version, and a
        seek to a logical offset (OFFSET_BEGINNING) sent first has its offset lookup
        answered as "outdated" and retried only after librdkafka's 500 ms offset-query
        back-off (measured: the first request of every new crawl waited for it). Records
        fetched between the two calls belong to the older version and are never delivered.
        """
        offsets, info = done.payload if done.payload is not None else ({}, None)
        # Only partitions still held: one revoked while its restore ran cannot be sought
        # (librdkafka raises _STATE, which ended the worker: seen once in the full suite).
        held = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        tps = [tp for tp in self.membership.expand([TopicPartition(self.membership.lead, p)
                                                    for p in sorted(done.complete)])
               if (tp.topic, tp.partition) in held]
        committed = {(tp.topic, tp.partition): offsets.get((tp.topic, tp.partition), -1)
                     for tp in tps}
        if resume and tps:
            consumer.resume(tps)
        for tp in tps:
            offset = committed[(tp.topic, tp.partition)]
            consumer.seek(TopicPartition(tp.topic, tp.partition,
                                         offset if offset >= 0 else OFFSET_BEGINNING))
        return tps, committed, info

    def report(self, done: Restored) -> None:
        """Count and log a finished restore."""
        if done.complete:
            self.status.add("restores")
            self.status.metrics.restored(done.seconds)
            self._log.info("%s %s: %s %s restored in %.2f s", self.stage, self.worker,
                           self.spec.restored, sorted(done.complete), done.seconds)
        if done.failed:
            self.status.add("restore_failures")
            self._log.error("%s %s: %s %s could not be restored%s; %s", self.stage,
                            self.worker, self.spec.failed, sorted(done.failed),
                            f" ({done.error})" if done.error else "", self.spec.then)

    def close(self) -> None:
        """Wait for a running restore to end (it writes to stores the stage closes next)."""
        self.restorer.close()
