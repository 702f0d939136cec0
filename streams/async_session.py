"""The asyncio runtime: one session of a stage with many records in flight at once (fetch).

The stage's logic runs on an event loop; every Kafka call (poll, rebalance callbacks,
transactional commits, seeks) runs on one dedicated thread, so callbacks and commits never
overlap. This module is that thread's side of a session:

- the clients: a consumer under static membership with follower partitions, a
  transactional committer, the control topic's reader (caught up before any work is taken:
  a worker started while the fleet is paused must fetch nothing);
- partitions assigned wait, paused, for the stage's state stores, restored off the poll
  thread (:class:`~streams.partition_restore.PartitionRestore`, as the batch runtime's);
  they then resume from the group's committed offsets, which also seed the
  :class:`~streams.ledger.Ledger`;
- a revoke commits finished work before the partitions move; if that hand-over fails, the
  session ends and the stage leaves the group before it rejoins (a static rejoin in the
  middle of a cooperative rebalance could leave the revoked partitions to nobody:
  :class:`~streams.io.StaleMembershipError`); a loss (the membership expired) poisons the ledger,
  commits nothing and ends the session;
- a commit takes what the ledger hands out and commits it with the stage's extra outputs;
  a failed one commits nothing more (the session ends and the next restores);
- the inputs pause while the stage is full or the fleet is paused;
- a worker whose version tuple is not in the approved set (read from the same control
  reader) takes no work: at start it joins no group, and once its tuple is revoked it
  polls nothing more and ends the session as a graceful stop does (finished work
  committed, the consumer closed); the stage then leaves the group at once.

What is the stage's own (its stores, what a restore brought, what a commit applies) it
answers through :class:`SessionLogic`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from core.config import Settings
from core.errors import CrawlfleetError
from core.versions import NotApprovedError, refusal, worker_tuple
from schemas.topics import Topology
from streams import faults
from streams.committer import TxnAbortedError, TxnCommitter, on_kafka_thread
from streams.control import ControlReader, ControlState
from streams.io import (
    Encoder,
    FencedError,
    HandOverError,
    Output,
    consume_ready,
    consumer_conf,
)
from streams.ledger import CommitBatch, Ledger
from streams.membership import Membership, group_share
from streams.partition_restore import PartitionRestore, RestoreSpec
from streams.restorer import Restored
from streams.stage import Stage
from streams.status import PollGaps, StatusFile
from streams.worker import StopFlag

log = logging.getLogger("crawlfleet.session")
R = TypeVar("R")
TP = tuple[str, int]
#: How long a starting worker waits for the control topic's end before it says so (and
#: keeps waiting: it takes no work without the settings in force).
CONTROL_CATCH_UP_S = 30.0
#: A control topic that cannot be read is tried again after this long.
CONTROL_RETRY_S = 2.0
#: Most records one poll hands the loop.
POLL_BATCH = 500


class SessionLogic(Protocol):
    """What the runtime asks of the stage (on the Kafka thread unless said otherwise)."""

    def restore(self, parts: set[int]) -> tuple[set[int], dict[TP, int], Any]:
        """Restorer thread: rebuild the state of ``parts``. (partitions that failed, the
        group's committed offsets of every input partition of ``parts``, what else the
        stage wants back in :meth:`restored`)."""

    def restored(self, done: Restored, info: Any) -> None:
        """The partitions of ``done`` are usable (or failed): the stage's share of it."""

    def keep_only(self, owned: set[int]) -> None:
        """Drop the local state of every partition not in ``owned`` (revoked, lost)."""

    def commit_outputs(self) -> list[Output]:
        """Outputs of the worker's own to add to the next transaction (gauge reports)."""

    def committed(self, batch: CommitBatch, written: dict[TP, int]) -> None:
        """A transaction committed: apply its state changes (``written``: the last offset
        it wrote to each changelog partition)."""

    def aborted(self, batch: CommitBatch) -> None:
        """A transaction failed: undo what it had taken out of the local stores."""

    def full(self, paused: bool) -> bool:
        """Whether the stage holds all it may (its inputs pause); ``paused``: they are."""

    def tick(self, now: float) -> None:
        """Each poll: housekeeping that belongs on this thread (store sweeps)."""

    def control_changed(self, state: ControlState) -> None:
        """The control state at start and after each change."""

    def members_changed(self, members: int, mine: int, total: int) -> None:
        """The group's live members, and the partitions this worker holds of all held,
        after a rebalance (only when the runtime was asked to track them)."""


@dataclass(frozen=True)
class SessionRole:
    """Who a session works as: the stage's settings, topology, name, worker, encoder,
    status file and stop flag (a :class:`~streams.stage.Stage`'s, by :meth:`of`)."""

    settings: Settings
    topology: Topology
    stage: str
    worker: str
    encoder: Encoder
    status: StatusFile
    stop: StopFlag

    @classmethod
    def of(cls, stage: Stage) -> SessionRole:
        return cls(stage.settings, stage.topology, stage.stage, stage.worker, stage.encoder,
                   stage.status, stage.stop)


class AsyncSession:
    """The Kafka thread's side of one session of an asyncio stage."""

    def __init__(self, role: SessionRole, ledger: Ledger, logic: SessionLogic,
                 changelogs: frozenset[str], track_members: bool = False) -> None:
        self.s, self.topo, self.stage, self.worker = (role.settings, role.topology,
                                                      role.stage, role.worker)
        self.enc, self.status, self.stop = role.encoder, role.status, role.stop
        self.ledger, self.logic, self.changelogs = ledger, logic, changelogs
        self.track_members = track_members
        self.kx = ThreadPoolExecutor(1, thread_name_prefix="kafka")
        self.loop = asyncio.get_running_loop()
        self.membership = Membership(self.topo, self.stage)
        self.restores = PartitionRestore(RestoreSpec(self.stage, log=log.name), self.stage,
                                         self.worker, self.status, self.membership,
                                         self._restore)
        self.restorer = self.restores.restorer
        self.poll_gaps = PollGaps(self.status)
        self.consumer: Consumer | None = None
        self.committer: TxnCommitter | None = None
        self.control: ControlReader | None = None
        self.admin: AdminClient | None = None
        self.broken: CrawlfleetError | None = None  # set by a rebalance callback
        self.paused = False  # the stage is full: its partitions are paused
        self.control_paused = False  # a person paused the fleet
        self.members_stale = False
        self.version = worker_tuple(self.s)
        self.leaving = False  # the tuple was revoked: end the session as a graceful stop
        self._control_changed = False  # control records applied, not handed to the stage
        self._refusal_due = False  # ... not checked against this worker's version yet
        #: When the transaction being committed began (None: no commit under way); read
        #: by the event loop, which holds new requests while a commit stalls.
        self.committing_since: float | None = None

    # --- the event loop's calls -----------------------------------------------------------

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        """Run ``fn`` on the Kafka thread."""
        return await self.loop.run_in_executor(self.kx, on_kafka_thread, fn, *args)

    async def start(self) -> None:
        await self.call(self._setup)

    async def poll(self, timeout: float) -> list[Message]:
        """Records of the owned, restored partitions; raises once the session is broken."""
        msgs = await self.call(self._poll, timeout)
        if self.broken is not None:
            raise self.broken
        return msgs

    async def commit(self) -> None:
        await self.call(self._commit)

    async def close(self) -> None:
        try:
            await self.call(self._teardown)
        finally:
            self.kx.shutdown(wait=True)

    @property
    def control_state(self) -> ControlState | None:
        return self.control.state if self.control is not None else None

    # --- Kafka thread ---------------------------------------------------------------------

    def _setup(self) -> None:
        group = self.topo.group(self.stage)
        self.committer = TxnCommitter(self.s, f"{group}-{self.worker}", self.worker)
        self.control = ControlReader(self.s, self.topo.control, self.enc.codec)
        while not self.control.catch_up(CONTROL_CATCH_UP_S):
            if self.stop.requested:
                return
            log.error("%s %s: cannot read %s to its end; not taking work until it can",
                      self.stage, self.worker, self.topo.control)
            self.status.add("control_catch_up_failures")
            time.sleep(CONTROL_RETRY_S)  # a missing topic fails at once: do not spin
        self.control_paused = self.control.state.paused
        why = refusal(self.control.state.approved, self.version)
        if why is not None:  # approved a moment ago, revoked since: join nothing
            raise NotApprovedError(why)
        self.logic.control_changed(self.control.state)
        self.consumer = Consumer(consumer_conf(self.s, group, self.worker))
        self.membership.subscribe(self.consumer, self._on_assign, self._on_revoke,
                                  self._on_lost, report=self.status)

    def _restore(self, parts: set[int]) -> tuple[set[int], dict[TP, int], Any]:
        return self.logic.restore(parts)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """New partitions (every input of each) wait, paused, for their state, restored on
        the restorer's thread: partitions already owned keep flowing, and the callback
        returns at once."""
        self.restores.assigned(consumer, partitions)
        self.status.gauges["restoring"] = len(self.restores.waiting)  # readiness, at once
        self.status.add("assigned_partitions", len(partitions))
        log.info("%s %s: assigned partitions %s", self.stage, self.worker,
                 sorted({p.partition for p in partitions}))
        self.members_stale = self.track_members  # read it outside the callback

    def _restored(self, done: Restored) -> None:
        """Partitions whose restore completed join the ledger and resume from the group's
        committed offsets (records polled before the pause took hold were dropped by the
        ledger: they are read again)."""
        assert self.consumer is not None
        tps, offsets, info = self.restores.seek(
            self.consumer, done, resume=not (self.paused or self.control_paused))
        # From the committed offsets: a partition whose only work is held in a store
        # consumes no record, and its results must still commit (with these offsets).
        self.ledger.assign([(tp.topic, tp.partition) for tp in tps], offsets)
        self.restores.report(done)
        self.logic.restored(done, info)

    def _refresh_members(self) -> None:
        """Re-read the group's live membership after a rebalance."""
        if self.admin is None:
            self.admin = AdminClient(self.s.kafka_common())
        share = group_share(self.admin, self.topo.group(self.stage), self.worker)
        if share is not None:  # else still rebalancing: keep the previous share, try again
            self.logic.members_changed(*share)
            self.status.gauges["members"] = share[0]
            self.members_stale = False

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = [(p.topic, p.partition) for p in partitions]
        self.restores.revoked(partitions)
        self.status.add("revoked_partitions", len(partitions))
        log.info("%s %s: revoked partitions %s", self.stage, self.worker,
                 sorted({p.partition for p in partitions}))
        self.ledger.revoke(revoked)
        try:
            # Hand over finished work before the partitions move. Not from the consumer's
            # positions: this callback may run inside consume(), after it returned records
            # that are not admitted yet, and a position past them would lose them.
            if faults.fails("abort_handover"):  # as if its commit failed (see streams.faults)
                self.ledger.aborted("fault injection")
                raise TxnAbortedError("fault injection: the hand-over commit must fail")
            self._commit(use_positions=False)
        except FencedError as exc:  # a newer twin holds our ids: it must not be evicted
            self.broken = exc
        except CrawlfleetError as exc:
            # Our state is no longer known to match the broker's: rebuild the session, and
            # as a fresh member (see StaleMembershipError).
            self.broken = HandOverError(f"hand-over commit failed: {exc}")
            self.status.add("handover_failures")
        self._forget(revoked)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions already gone (session timed out): drop the work, commit nothing."""
        revoked = [(p.topic, p.partition) for p in partitions]
        self.restores.revoked(partitions)
        self.status.add("lost_partitions", len(partitions))
        self.ledger.revoke(revoked)
        self.ledger.poison("partitions lost")
        self.broken = FencedError("partitions lost: membership expired")
        self._forget(revoked)

    def _forget(self, revoked: list[TP]) -> None:
        self.logic.keep_only(self.ledger.forget(revoked) | self.restorer.waiting)

    def _commit(self, use_positions: bool = True) -> None:
        assert self.consumer is not None and self.committer is not None
        positions = {(p.topic, p.partition): p.offset
                     for p in self.consumer.position(self.consumer.assignment())} \
            if use_positions else {}
        batch = self.ledger.take_commit(positions)
        if batch is None:
            return
        batch.outputs += self.logic.commit_outputs()
        self.committing_since = time.monotonic()
        try:
            written = self.committer.commit(
                self.consumer, batch.outputs,
                [TopicPartition(t, p, o) for (t, p), o in batch.offsets.items()],
                self.changelogs)
        except CrawlfleetError as exc:
            self.status.add("aborted_txns")
            self.ledger.aborted(str(exc))  # commits nothing more: the session rebuilds
            self.logic.aborted(batch)
            raise
        finally:
            self.committing_since = None
        self.logic.committed(batch, written)
        self.ledger.committed(batch)
        self.status.add("committed_txns")
        self.status.add("produced", len(batch.outputs))

    def _poll(self, timeout: float) -> list[Message]:
        assert self.consumer is not None and self.control is not None
        if self.broken is not None:  # a callback ended the session: nothing more is taken
            return []
        self._read_control()
        if self._refusal_due and not self.leaving:
            self._refusal_due = False
            why = refusal(self.control.state.approved, self.version)
            if why is not None:
                # Nothing more is polled: every record returned so far is admitted, so
                # the final commit's positions lose none.
                self.leaving = True
                self.broken = NotApprovedError(why)
        if self.leaving:
            return []
        for done in self.restores.finished():
            self._restored(done)
        if self.members_stale:
            self._refresh_members()
        self.logic.tick(time.monotonic())
        self._apply_pause()
        self.poll_gaps.tick()
        msgs = consume_ready(self.consumer, POLL_BATCH, self.restores.poll_timeout(timeout))
        if msgs and self._read_control():
            # What the control topic said while the poll waited (a pause) is in force
            # before these records are admitted: a long idle poll widens no window. (A
            # refusal is acted on by the next poll: these records are admitted first.)
            self._apply_pause()
        return msgs

    def _read_control(self) -> bool:
        """Apply new control records to the state (True if any changed it); the stage
        and the approval check hear of it next."""
        assert self.control is not None
        changed = self.control.poll(0)
        if changed:
            self._control_changed = self._refusal_due = True
        return changed

    def _apply_pause(self) -> None:
        """Pause or resume the input as the worker's fullness and the fleet's pause say,
        and hand a changed control state to the stage."""
        assert self.consumer is not None and self.control is not None
        full = self.logic.full(self.paused)
        want_paused = full or self.control.state.paused
        if want_paused != (self.paused or self.control_paused):
            if want_paused:
                self.consumer.pause(self.consumer.assignment())
            else:  # not the partitions still waiting for their restore
                waiting = self.restorer.waiting
                self.consumer.resume([tp for tp in self.consumer.assignment()
                                      if tp.partition not in waiting])
        self.paused, self.control_paused = full, self.control.state.paused
        if self._control_changed:
            self._control_changed = False
            self.logic.control_changed(self.control.state)

    def _teardown(self) -> None:
        if self.consumer is not None:
            if (self.stop.requested or self.leaving) and self.committer is not None:
                try:
                    self._commit()  # graceful stop: finished work is not redone
                except CrawlfleetError as exc:
                    log.warning("final commit failed: %s", exc)
            # Leaving the group serves the revoke callback, which commits again unless a
            # commit failed: then the ledger is broken and hands out nothing.
            self.consumer.close()
        if self.committer is not None:
            self.committer.close()
        self.restores.close()
        if self.control is not None:
            self.control.close()

    def commit_age(self, now: float) -> float:
        """Seconds the commit under way has taken so far (0: none under way)."""
        since = self.committing_since
        return 0.0 if since is None else max(0.0, now - since)

    def gauges(self) -> dict[str, int]:
        """The session's own gauges, for the stage's status report."""
        return {"uncommitted": self.ledger.uncommitted, "paused": int(self.paused),
                "restoring": len(self.restorer.waiting),
                "restore_failing": len(self.restorer.failing)}
