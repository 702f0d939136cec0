"""The batch runtime: synchronous consume → transform → produce stages (parse, retry).

Each poll batch is one Kafka transaction: its outputs and its input offsets commit
together, so a crash anywhere replays the batch and downstream never sees a duplicate.

A stage that owns state per partition names its stores and timer stores in its
``StageSpec`` (retry: one timer store); the runtime opens them, hands them to the stage as
``self.context`` (:class:`~streams.stage_context.StageContext`), restores them on assign
(:mod:`streams.partition_restore`: new partitions pause until their state is restored off
the poll thread, then resume from the group's committed offsets, kept out of batches until
then), applies each batch's writes after it commits, fires due timers between polls into
the stage's :meth:`BatchStage.on_timer`, and closes them. A stage without state (parse)
pays nothing for it. A stage keeping state of another kind may still declare
``state_restore`` and answer the ``restore``/``restored``/``revoked`` hooks itself.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from typing import Any, ClassVar

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from core.config import Settings
from core.errors import DecodeError, FatalError, KafkaStageError
from schemas.stages import stage_spec
from streams.committer import TxnCommitter
from streams.idle_poll import IdlePoll
from streams.io import (
    FencedError,
    Output,
    consume_ready,
    consumer_conf,
    offset_of,
    raw_value,
    rewind,
    tp_of,
)
from streams.membership import Membership
from streams.partition_restore import TP, PartitionRestore, RestoreSpec
from streams.restorer import Restored
from streams.slow_start import SlowStart
from streams.stage import Stage
from streams.stage_context import StageContext
from streams.worker import StopFlag

log = logging.getLogger("crawlfleet.stage")
#: A partition whose declared stores could not be restored is retried this often (paused).
RESTORE_RETRY_S = 10.0


class NotDueError(Exception):
    """Raised by ``handle`` when a record must wait; its partition pauses, not the loop."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"not due for {wait_s:.2f}s")
        self.wait_s = wait_s


class BatchStage(Stage):
    """A stage whose session consumes batches and commits each in one transaction."""

    batch_size: ClassVar[int] = 500
    #: State changelogs this stage writes: ``delivered`` then holds, for the ``committed``
    #: hook, the last offset each transaction wrote to each of their partitions.
    changelogs: frozenset[str] = frozenset()
    #: Partition-owned state, restored whenever partitions are assigned (None: the stage has
    #: none). A stage declaring it answers :meth:`restore`, :meth:`restored` and
    #: :meth:`revoked`; its inputs must be one lead topic and its followers.
    state_restore: ClassVar[RestoreSpec | None] = None

    def __init__(self, settings: Settings, worker_id: str | None = None,
                 stop: StopFlag | None = None) -> None:
        super().__init__(settings, worker_id, stop)
        self._paused_until: dict[tuple[str, int], float] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._revoked: set[tuple[str, int]] = set()  # since the last gather
        self.slow_start = SlowStart()  # records per transaction after a quiet spell
        self.delivered: dict[tuple[str, int], int] = {}
        self._restores: PartitionRestore | None = None
        self._idle = IdlePoll()
        self._restore_consumer: Consumer | None = None  # the consumer of the last assign
        spec = stage_spec(self.stage)
        #: The stores and timer stores the stage declares, opened by the runtime.
        self.context: StageContext | None = None
        restore = self.state_restore
        if restore is None and spec.state:
            self.context = StageContext(settings, self.topology, spec, self.worker,
                                        self.encoder, self.status)
            self.changelogs = self.context.changelogs
            names = ", ".join(spec.store_names)
            restore = RestoreSpec(names, RESTORE_RETRY_S, restored=f"{names} of partitions",
                                  failed=f"{names} store of partitions",
                                  then=f"their inputs stay paused, retried every "
                                       f"{RESTORE_RETRY_S:.0f} s")
        elif restore is not None and type(self).restore is BatchStage.restore:
            raise TypeError(f"{type(self).__name__} declares state_restore but no restore")
        if restore is not None:
            self._restores = PartitionRestore(restore, self.stage, self.worker, self.status,
                                              self.membership, self._restore_parts)

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self._restores is not None:
                self._restores.close()  # a running restore writes to the stage's stores
            if self.context is not None:
                self.context.close()

    @abstractmethod
    def handle(self, msg: Message) -> list[Output]:
        """Outputs for one input record; raise DecodeError/FatalError to dead-letter it."""

    def session(self) -> None:
        """Consume, transform and commit until stopped. It starts with nothing of an
        earlier session: after a failed commit (fenced, aborted, or a broker error) a
        commit past the failed batch would lose its records."""
        self._committed.clear()
        self._paused_until.clear()
        self.rolled_back()
        group = self.topology.group(self.stage)
        committer = TxnCommitter(self.settings, f"{group}-{self.worker}", self.worker)
        consumer = Consumer(consumer_conf(self.settings, group, self.worker))
        self.membership.subscribe(consumer, self._on_assign, self._on_revoke,
                                  report=self.status)
        try:
            while not self.stop.requested:
                self.approval.check()  # revoked: leave between transactions
                self._resume_due(consumer)
                self._revoked.clear()
                msgs = self._gather(consumer)
                if self._revoked:
                    # Partitions moved while gathering (only those: the rebalance is
                    # incremental): their records are the new owner's, not ours to commit.
                    msgs = [m for m in msgs if tp_of(m) not in self._revoked]
                    owned = {(p.topic, p.partition) for p in consumer.assignment()}
                    # One revoked and assigned again: re-read it from its committed offset.
                    rewind(consumer, [TopicPartition(t, p) for t, p in self._revoked & owned])
                # No poll between these transactions, so no rebalance can come in between.
                rest = self._process(consumer, committer, msgs)
                while rest and not self.stop.requested:
                    rest = self._process(consumer, committer, rest)
                self.status.write()
        finally:
            consumer.close()  # leaves the group now, not after the session timeout
            committer.close()

    def _gather(self, consumer: Consumer) -> list[Message]:
        """One batch: wait up to 0.2 s for a first record, then take what is already fetched.

        Batches size themselves: under load, records pile up while the previous batch is
        processed and committed, so transactions get fuller exactly when commits would
        otherwise cost the most; when lightly loaded, nothing waits for a batch to fill.
        """
        self.poll_gaps.tick()
        holding = bool(self.held_partitions()) or (
            self.context is not None and self.context.timers_live() > 0)
        timeout = self._idle.timeout(0.2, holding)
        if self._restores is not None:
            timeout = self._restores.poll_timeout(timeout)
        msgs = consume_ready(consumer, self.batch_size, timeout)
        if msgs:
            self._idle.took()
        return msgs

    @property
    def membership(self) -> Membership:
        return Membership(self.topology, self.stage)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Only ``partitions`` move (cooperative): forget what we knew of them (a restore of
        theirs still running is cancelled, their local state dropped)."""
        for p in partitions:
            key = (p.topic, p.partition)
            self._revoked.add(key)
            self._committed.pop(key, None)
            self._paused_until.pop(key, None)
        if self._restores is not None:
            self._restores.revoked(partitions)
            self.revoked({p.partition for p in partitions})

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Newly assigned ``partitions`` (already added to the assignment). With partition
        state, they (every input of each: see Membership) wait, paused, for it: restored on
        the restorer's thread, never in this callback."""
        for p in partitions:
            self._revoked.discard((p.topic, p.partition))
        if self._restores is not None:
            self._restore_consumer = consumer
            self._restores.assigned(consumer, partitions)
            self.status.gauges["restoring"] = len(self._restores.waiting)  # readiness

    # --- partition-owned state ------------------------------------------------------------

    def restore(self, parts: set[int]) -> tuple[set[int], Any]:
        """Hook (restorer thread): rebuild the local state of ``parts`` from its
        changelogs. Returns (the partitions that could not be restored: they stay paused and
        are retried, what :meth:`restored` gets as ``info``). The declared stores'
        restore is the runtime's; a stage with ``state_restore`` writes its own."""
        if self.context is None:
            raise NotImplementedError
        return self.context.restore(parts)

    def restored(self, done: Restored, info: Any) -> None:
        """Hook: the partitions of ``done`` are usable (or failed); ``info`` is what
        :meth:`restore` returned for them (None if it raised)."""
        if self.context is not None:
            self.context.restored(done, info)

    def revoked(self, parts: set[int]) -> None:
        """Hook: ``parts`` moved: drop their local state."""
        if self.context is not None:
            self.context.revoked(parts)

    def on_timer(self, timer: str, part: int, ident: bytes,
                 record: dict[str, Any]) -> list[Output]:
        """Hook (a stage with timer stores): the outputs of a due timer of ``timer`` in
        partition ``part`` (``ident``: the id it was scheduled under, ``record`` its record);
        they commit with the timer's tombstone."""
        raise NotImplementedError(f"{type(self).__name__} declares timers but no on_timer")

    def _restore_parts(self, parts: set[int]) -> tuple[set[int], dict[TP, int], Any]:
        """Restorer thread: the group's committed offsets of ``parts``, then their state.

        Stable offsets, read first: a former owner's last transaction (and what it wrote to
        the changelogs) is settled before the restore reads them.
        """
        assert self._restores is not None
        offsets = self._restores.committed_offsets(self.settings,
                                                   self.topology.group(self.stage), parts)
        failed, info = self.restore(parts)
        return failed, offsets, info

    def _use_restored(self) -> None:
        """Finished restores: their complete partitions resume where the group committed."""
        assert self._restores is not None
        consumer = self._restore_consumer
        if consumer is not None:  # else nothing was ever assigned, nor restored
            for done in self._restores.finished():
                _, offsets, info = self._restores.seek(consumer, done)  # and resumed
                for key, offset in offsets.items():
                    if offset >= 0:
                        # With it, a transaction of only the stage's own outputs (retry's
                        # due timers) carries offsets too, so the broker checks our
                        # generation.
                        self._committed[key] = offset
                self._restores.report(done)
                self.restored(done, info)
        self.status.gauges["restore_failing"] = len(self._restores.failing)
        self.status.gauges["restoring"] = len(self._restores.waiting)

    def rolled_back(self) -> None:
        """Hook: in-memory state derived from uncommitted work must be forgotten."""
        if self.context is not None:
            self.context.rolled_back()

    def begin_batch(self) -> None:
        """Hook: called before each batch, when all earlier outputs are committed."""
        return

    def own_outputs(self) -> list[Output]:
        """Hook: outputs not derived from this batch's records (the retry stage's due timers).

        They commit in the batch's transaction, which then carries every input offset this
        generation has committed, so the broker fences a stale owner's commit even when no
        input moved. By default: the declared timers that are due (:meth:`on_timer`).
        """
        if self.context is None:
            return []
        return self.context.fire({p for _, p in self._committed}, self.on_timer)

    def committed(self) -> None:
        """Hook: the batch's transaction committed; apply the local state derived from it."""
        if self.context is not None:
            self.context.committed(self.delivered)

    def unusable(self) -> set[tuple[str, int]]:
        """Assigned partitions whose records must wait (state not restored yet)."""
        return self._restores.unusable() if self._restores is not None else set()

    def held_partitions(self) -> int:
        """Input partitions this stage holds back (paused until due, or not ready: one per
        partition number waiting for its state, whatever the number of its inputs)."""
        waiting = len(self._restores.waiting) if self._restores is not None else 0
        return len(self._paused_until) + waiting

    def _process(self, consumer: Consumer, committer: TxnCommitter,
                 msgs: list[Message]) -> list[Message]:
        """One transaction over a prefix of ``msgs``; returns the records left for the next.

        The prefix is capped by slow start: a burst after a quiet spell (a crawl's next
        level) is committed in growing steps, so its first links reach the frontier early.
        """
        # Taken before finished restores make partitions usable and seek them back: records
        # of theirs already in ``msgs`` (polled before the pause took hold) are skipped here
        # and read again from the committed offset, not handled twice.
        unusable = self.unusable()
        if self._restores is not None:
            self._use_restored()
        self.begin_batch()
        cap = self.slow_start.cap()
        outputs: list[Output] = []
        offsets: dict[tuple[str, int], int] = {}
        held: set[tuple[str, int]] = set()
        rest: list[Message] = []
        processed = 0
        for i, msg in enumerate(msgs):
            if processed >= cap:
                rest = [m for m in msgs[i:]
                        if m.error() is None and tp_of(m) not in held | unusable]
                break
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("%s consume error: %s", self.stage, err)
                continue
            tp = tp_of(msg)
            if tp in held or tp in unusable:
                continue  # unusable: read again from the committed offset once it is ready
            if self.context is not None:
                self.context.observe(msg)  # broker time, for the timers
            try:
                outputs.extend(self.handle(msg))
                self.status.add("processed")
            except NotDueError as nd:
                held.add(tp)
                self._hold(consumer, msg, nd.wait_s)
                continue
            except DecodeError as exc:
                outputs.append(self.encoder.undecodable(msg, exc))
                self.status.add("dead")
                self.status.metrics.dead_letter(exc.reason)
            except FatalError as exc:
                outputs.append(self.encoder.dead(None, raw_value(msg), tp[0], exc.reason,
                                                 str(exc), 1))
                self.status.add("dead")
                self.status.metrics.dead_letter(exc.reason)
            except (FencedError, KafkaStageError):
                raise  # the stage's own standing, not this record's fault
            except Exception as exc:  # no record can crash the stage into a replay loop
                log.exception("%s: handling %s:%d@%d failed unexpectedly", self.stage,
                              tp[0], tp[1], offset_of(msg))
                outputs.append(self.encoder.dead(None, raw_value(msg), tp[0], "internal",
                                                 f"{type(exc).__name__}: {exc}", 1))
                self.status.add("dead")
                self.status.add("internal_errors")
                self.status.metrics.dead_letter("internal")
            offsets[tp] = offset_of(msg) + 1
            processed += 1
        # The position also steps over transaction markers, so an idle stage's lag is 0;
        # not for partitions with records left for the next transaction.
        unfinished = held | unusable | {tp_of(m) for m in rest}
        for pos in consumer.position(consumer.assignment()):
            key = (pos.topic, pos.partition)
            if pos.offset >= 0 and key not in unfinished and pos.offset > offsets.get(key, -1):
                offsets[key] = pos.offset
        changed = {k: o for k, o in offsets.items() if self._committed.get(k) != o}
        own = self.own_outputs()
        if not changed and not own:
            return rest
        outputs.extend(own)
        commit = {**self._committed, **changed} if own else changed
        try:
            self.delivered = committer.commit(
                consumer, outputs, [TopicPartition(t, p, o) for (t, p), o in commit.items()],
                self.changelogs)
            self._committed.update(changed)
            self.status.add("committed_txns")
            self.slow_start.committed(processed)
        except KafkaStageError:
            # Aborted (TxnAbortedError), or its outcome unknown: this session commits
            # nothing more; run() rejoins from the committed offsets.
            self.status.add("aborted_txns")
            raise
        self.committed()
        return rest

    def _hold(self, consumer: Consumer, msg: Message, wait_s: float) -> None:
        topic, partition = tp_of(msg)
        tp = TopicPartition(topic, partition, offset_of(msg))
        consumer.pause([tp])
        consumer.seek(tp)
        self._paused_until[(topic, partition)] = time.monotonic() + wait_s

    def _resume_due(self, consumer: Consumer) -> None:
        now = time.monotonic()
        due = [k for k, t in self._paused_until.items() if t <= now]
        if due:
            consumer.resume([TopicPartition(t, p) for t, p in due])
            for k in due:
                del self._paused_until[k]
        self.status.gauges["held_partitions"] = self.held_partitions()
