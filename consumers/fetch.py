"""Fetch stage: frontier jobs → polite HTTP fetches → FetchResult, retry or dead letter.

One asyncio loop runs many fetches at once; one dedicated thread makes every Kafka call
(poll, rebalance callbacks, transactional commits), so callbacks and commits never
overlap. This module only wires the parts to Kafka (``_Session``: clients, rebalances,
restores, commits, flow control):

- :class:`Intake` — frontier records admitted, parked beyond a target's share, refilled,
  and every finished job handed to the ledger;
- :class:`Dispatcher` — which queued job starts now, and one job's robots.txt check and
  request;
- :class:`FetchStores` — the seen store and parked queues of the owned partitions,
  restored, advanced and dropped together;

- :class:`Ledger` — epochs, offsets, dedupe holders, what each transaction carries;
- :class:`TargetScheduler` — per-target queues and release times, so a slow or deferred
  target never blocks another;
- :class:`TargetPolicy` — every per-target rule: rate (cap, Crawl-delay, adaptive
  slowdown), in-flight limit, rests, crawl windows, memory share, forgetting idle targets;
- :class:`ParkedQueues` — a target's work beyond its memory share, parked on disk in
  order, so a big target cannot fill the worker and starve the others;
- :class:`OutcomeRules` — a response or error → records and the target's signal.

Completed work, its dedupe state, parked-queue changes and the safe input offsets commit
together in one transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from consumers.fetch_dispatch import Dispatcher
from consumers.fetch_intake import Intake
from consumers.fetch_stores import FetchStores
from consumers.http_fetch import Fetcher
from consumers.outcomes import OutcomeRules
from consumers.pacer import Pacer
from consumers.parking import ParkedQueues
from consumers.robots_cache import RobotsCache
from consumers.scheduler import TargetScheduler
from consumers.seen import SeenStore
from consumers.target_policy import TargetPolicy
from core.config import Settings
from core.errors import (
    CrawlfleetError,
    KafkaStageError,
)
from infra.topics import topology_of
from streams.committer import TxnCommitter, on_kafka_thread
from streams.control import ControlReader
from streams.io import (
    Encoder,
    FencedError,
    consume_ready,
    consumer_conf,
)
from streams.ledger import Ledger, Pending
from streams.membership import Membership, group_share
from streams.restorer import Restored, Restorer
from streams.slow_start import SlowStart
from streams.state_store import StateStore, store_dir
from streams.status import PollGaps, StatusFile
from streams.worker import REJOIN_PAUSE_S, StopFlag, wait_for_kafka, worker_name

log = logging.getLogger("crawlfleet.fetch")
R = TypeVar("R")
TP = tuple[str, int]
#: A worker out of queued jobs hands its results on this often, not on the full interval.
_STARVED_COMMIT_S = 0.1
#: How long a starting worker waits for the control topic's end before it says so (and
#: keeps waiting: it takes no work without the settings in force).
CONTROL_CATCH_UP_S = 30.0
#: A control topic that cannot be read is tried again after this long.
CONTROL_RETRY_S = 2.0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed: a cheaper loop per request on the busiest stage."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class FetchStage:
    stage = "fetch"

    def __init__(self, settings: Settings, worker_id: str | None = None,
                 stop: StopFlag | None = None) -> None:
        self.s = settings
        self.topology = topology_of(settings)
        self.worker = worker_name(self.stage, worker_id, settings.data_dir / "workers")
        self.stop = stop if stop is not None else StopFlag()
        self.encoder = Encoder(self.topology, self.worker)
        self.status = StatusFile(settings.status_dir, self.stage, self.worker)

    def run(self) -> None:
        """Fetch until stopped; on fencing or an aborted transaction, drop all and rejoin."""
        while not self.stop.requested:
            try:
                with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                    runner.run(self._session())
            except (FencedError, KafkaStageError) as exc:
                # Everything uncommitted is dropped with the session; the next one restores
                # its state and offsets from what is committed, and redoes the rest.
                log.warning("fetch %s lost its transaction, rejoining: %s", self.worker, exc)
                self.status.add("fenced")
                time.sleep(REJOIN_PAUSE_S)  # a broker that is down fails at once: no spin
                wait_for_kafka(self.s, self.stop, self.status, f"fetch {self.worker}")
        self.status.remove()

    async def _session(self) -> None:
        await _Session(self).run()


def commit_due(since_commit_s: float, completed: int, queued: int, running: int,
               burst_cap: int, interval_s: float) -> bool:
    """Whether finished work should be committed (handed on) now.

    Under load, on the interval (fewer, fuller transactions). With nothing queued to start,
    the crawl is waiting on the links in our results: every ``_STARVED_COMMIT_S``, and at
    once when nothing is in flight either. After a quiet spell, results go out in growing
    transactions (slow start: ``burst_cap``), so a crawl's next level is found while this
    one is still being fetched.
    """
    starved = bool(completed) and not queued and (
        not running or since_commit_s >= _STARVED_COMMIT_S)
    return since_commit_s >= interval_s or starved or completed >= burst_cap


class _Session:
    """One membership of the group: clients, in-memory state, all dropped together."""

    def __init__(self, stage: FetchStage) -> None:
        self.st = stage
        self.s = stage.s
        self.topo = stage.topology
        self.enc = stage.encoder
        self.status = stage.status
        self.kx = ThreadPoolExecutor(1, thread_name_prefix="kafka")
        self.ledger = Ledger()
        self.rules = OutcomeRules(self.s, self.topo, self.enc, stage.worker)
        self.sched: TargetScheduler[Pending] = TargetScheduler(
            self._base_interval, limit=self.s.max_inflight_per_target)
        self.seen = SeenStore(store_dir(self.s, "seen", stage.worker), ttl_s=self.s.seen_ttl_s)
        self.membership = Membership(self.topo, "fetch")
        self.parked = ParkedQueues(StateStore("parked", store_dir(self.s, "parked", stage.worker)),
                                   self.topo.partitions)
        self.stores = FetchStores(self.s, self.topo, self.enc, self.seen, self.parked,
                                  self.membership)
        self.restorer = Restorer("fetch", self.stores.restore)
        self.robots = RobotsCache(self.s.robots_agent, self.s.robots_ttl_s,
                                  lambda t, i: self.policy.on_robots(t, i),
                                  max_origins=self.s.max_target_state)
        self.policy = TargetPolicy(self.s, self.sched, self.robots, self._cap,
                                   self.status.add)
        self.paused = False  # this worker is full: its partitions are paused
        self.wake = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self.consumer: Consumer | None = None
        self.broken: CrawlfleetError | None = None  # set by a rebalance callback
        self.control: ControlReader | None = None
        self.pacer = Pacer(self.s.fleet_rate_cap)
        self.members_stale = False
        self.admin: AdminClient | None = None
        self.committer: TxnCommitter | None = None
        self.slow_start = SlowStart(floor=150)  # outputs (~3 per page) per transaction
        self.poll_gaps = PollGaps(self.status)
        self.intake = Intake(self.s, self.topo, self.enc, self.ledger, self.seen, self.parked,
                             self.policy, self.sched, self.rules, self.status, self.wake)
        self.dispatch = Dispatcher(self.s, self.topo, self.sched, self.policy, self.robots,
                                   self.rules, self.ledger, self.parked, self.intake,
                                   self.pacer, self.status, self.wake)
        self.status.gauge_fns["deferred_targets"] = \
            lambda: self.policy.deferred_targets(time.monotonic())

    # --- Kafka thread -------------------------------------------------------------------

    async def _kafka(self, fn: Callable[..., R], *args: Any) -> R:
        return await self.loop.run_in_executor(self.kx, on_kafka_thread, fn, *args)

    def _setup(self) -> None:
        group = self.topo.group("fetch")
        self.committer = TxnCommitter(self.s, f"{group}-{self.st.worker}", self.st.worker)
        self.control = ControlReader(self.s, self.topo.control, self.enc.codec)
        # The settings in force (a fleet-wide pause above all) before any job is taken: a
        # worker started while the fleet is paused must not fetch anything.
        while not self.control.catch_up(CONTROL_CATCH_UP_S):
            if self.st.stop.requested:
                return
            log.error("fetch %s: cannot read %s to its end; not taking work until it can",
                      self.st.worker, self.topo.control)
            self.status.add("control_catch_up_failures")
            time.sleep(CONTROL_RETRY_S)  # a missing topic fails at once: do not spin
        self.dispatch.paused = self.control.state.paused
        self.consumer = Consumer(consumer_conf(self.s, group, self.st.worker))
        self.membership.subscribe(self.consumer, self._on_assign, self._on_revoke,
                                  self._on_lost, report=self.status)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """New partitions (both tiers of each) wait, paused, for their dedupe and parked
        stores, restored on the restorer's thread: the partitions this worker already owns
        keep flowing meanwhile, and the callback returns at once."""
        consumer.pause(partitions)
        self.restorer.start({p.partition for p in partitions})
        self.status.add("assigned_partitions", len(partitions))
        log.info("fetch %s: assigned partitions %s", self.st.worker,
                 sorted({p.partition for p in partitions}))
        self.members_stale = self.s.fleet_rate_cap > 0  # read it outside the callback

    def _restored(self, done: Restored) -> None:
        """Kafka thread: partitions whose restore completed join the ledger and resume from
        the group's committed offsets (records polled before the pause took hold were
        dropped by the ledger: they are read again)."""
        assert self.consumer is not None
        offsets, targets, records, seconds = done.payload if done.payload is not None \
            else ({}, [], 0, 0.0)
        self.status.add("seen_restored", records)
        self.status.add("restore_ms", int(seconds * 1000))
        tps = self.membership.expand([TopicPartition(self.topo.frontier, p)
                                      for p in sorted(done.complete)])
        for tp in tps:
            offset = offsets.get((tp.topic, tp.partition), -1)
            self.consumer.seek(TopicPartition(tp.topic, tp.partition,
                                              offset if offset >= 0 else OFFSET_BEGINNING))
        # From the committed offsets: a partition whose only work is parked jobs consumes
        # no record, and its results must still commit (with these offsets).
        self.ledger.assign([(tp.topic, tp.partition) for tp in tps],
                           {(tp.topic, tp.partition): offsets.get((tp.topic, tp.partition), -1)
                            for tp in tps})
        if tps and not (self.paused or self.dispatch.paused):
            self.consumer.resume(tps)
        if done.complete:
            self.status.add("restores")
            self.status.metrics.restored(done.seconds)
            log.info("fetch %s: partitions %s restored in %.2f s", self.st.worker,
                     sorted(done.complete), done.seconds)
        for p in done.failed:
            self.parked.dropped(p)
        if done.failed:
            self.status.add("restore_failures")
            log.error("fetch %s: state of partitions %s could not be restored%s; they stay "
                      "paused and are retried", self.st.worker, sorted(done.failed),
                      f" ({done.error})" if done.error else "")
        if targets:
            self.loop.call_soon_threadsafe(self.intake.refill_many, targets)

    def _refresh_members(self) -> None:
        """Re-read the fetch group's live membership after a rebalance (fleet-wide cap)."""
        if self.admin is None:
            self.admin = AdminClient(self.s.kafka_common())
        share = group_share(self.admin, self.topo.group("fetch"), self.st.worker)
        if share is not None:  # else still rebalancing: keep the previous share, try again
            self.pacer.set_members(*share)
            self.status.gauges["members"] = share[0]
            self.members_stale = False

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = [(p.topic, p.partition) for p in partitions]
        self.restorer.cancel({p.partition for p in partitions})
        self.status.add("revoked_partitions", len(partitions))
        log.info("fetch %s: revoked partitions %s", self.st.worker,
                 sorted({p.partition for p in partitions}))
        self.ledger.revoke(revoked)
        try:
            # Hand over finished work before the partitions move. Not from the consumer's
            # positions: this callback may run inside consume(), after it returned records
            # that are not admitted yet, and a position past them would lose them.
            self._commit(use_positions=False)
        except CrawlfleetError as exc:
            # Our state is no longer known to match the broker's: rebuild the session.
            self.broken = exc
        self._forget(revoked)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions already gone (session timed out): drop the work, commit nothing."""
        revoked = [(p.topic, p.partition) for p in partitions]
        self.restorer.cancel({p.partition for p in partitions})
        self.status.add("lost_partitions", len(partitions))
        self.ledger.revoke(revoked)
        self.ledger.poison("partitions lost")
        self.broken = FencedError("partitions lost: membership expired")
        self._forget(revoked)

    def _forget(self, revoked: list[TP]) -> None:
        self.stores.keep_only(self.ledger.forget(revoked) | self.restorer.waiting)
        self.loop.call_soon_threadsafe(self.dispatch.drop_stale)

    def _commit(self, use_positions: bool = True) -> None:
        assert self.consumer is not None and self.committer is not None
        positions = {(p.topic, p.partition): p.offset
                     for p in self.consumer.position(self.consumer.assignment())} \
            if use_positions else {}
        batch = self.ledger.take_commit(positions)
        if batch is None:
            return
        batch.outputs += self.intake.backlog_reports(self.st.worker)
        try:
            written = self.committer.commit(
                self.consumer, batch.outputs,
                [TopicPartition(t, p, o) for (t, p), o in batch.offsets.items()],
                frozenset({self.topo.seen, self.topo.parked}))
        except CrawlfleetError as exc:
            self.status.add("aborted_txns")
            self.ledger.aborted(str(exc))  # commits nothing more: the session rebuilds
            self.parked.aborted(batch.changes)
            raise
        gained = self.stores.committed(batch, written)
        self.ledger.committed(batch)
        self.slow_start.committed(len(batch.outputs))
        self.status.add("committed_txns")
        self.status.add("produced", len(batch.outputs))
        if gained:
            self.loop.call_soon_threadsafe(self.intake.refill_many, gained)

    def _poll(self, timeout: float) -> list[Message]:
        assert self.consumer is not None and self.control is not None
        changed = self.control.poll(0)
        for done in self.restorer.finished():
            self._restored(done)
        if self.members_stale:
            self._refresh_members()
        swept = self.stores.sweep_expired(time.monotonic())
        if swept is not None:
            self.status.add("seen_expired", swept)
        # Memory is bounded per target (work beyond a share is parked), so the worker as a
        # whole is full only when many targets are each at their share.
        buffered = len(self.sched) + self.dispatch.running
        full = buffered >= self.s.max_buffered or (
            self.paused and buffered >= self.s.max_buffered // 2)
        want_paused = full or self.control.state.paused
        if want_paused != (self.paused or self.dispatch.paused):
            if want_paused:
                self.consumer.pause(self.consumer.assignment())
            else:  # not the partitions still waiting for their restore
                waiting = self.restorer.waiting
                self.consumer.resume([tp for tp in self.consumer.assignment()
                                      if tp.partition not in waiting])
        self.paused, self.dispatch.paused = full, self.control.state.paused
        if changed:
            self.loop.call_soon_threadsafe(self.dispatch.apply_control, self.control.state)
        self.poll_gaps.tick()
        return consume_ready(self.consumer, 500, timeout)

    # --- event loop ---------------------------------------------------------------------

    async def run(self) -> None:
        await self._kafka(self._setup)
        try:
            async with Fetcher(self.s) as fetcher:
                self.dispatch.fetcher = fetcher
                self.robots.fetcher = fetcher
                dispatcher = asyncio.create_task(self.dispatch.dispatch_loop())
                try:
                    await self._main_loop()
                finally:
                    dispatcher.cancel()
                    for t in list(self.dispatch.tasks):
                        t.cancel()
                    await asyncio.gather(dispatcher, *self.dispatch.tasks,
                                         return_exceptions=True)
        finally:
            await self._kafka(self._teardown)
            self.kx.shutdown(wait=True)

    def _teardown(self) -> None:
        if self.consumer is not None:
            if self.st.stop.requested and self.committer is not None:
                try:
                    self._commit()  # graceful stop: finished work is not redone
                except CrawlfleetError as exc:
                    log.warning("final commit failed: %s", exc)
            # Leaving the group serves the revoke callback, which commits again unless a
            # commit failed: then the ledger is broken and hands out nothing.
            self.consumer.close()
        if self.committer is not None:
            self.committer.close()
        self.restorer.close()
        self.stores.close()
        if self.control is not None:
            self.control.close()

    async def _main_loop(self) -> None:
        last_commit = time.monotonic()
        while not self.st.stop.requested:
            # Jobs queued, in flight or finished but uncommitted: look again soon, so results
            # are committed (handed on) as soon as the last of them is done. A poll cannot be
            # woken early, and a job queued now is often done within a millisecond: a longer
            # wait here was most of each hop of a chain-like crawl (50 of its ~60 ms).
            busy = self.dispatch.running or self.ledger.completed or len(self.sched)
            msgs = await self._kafka(self._poll, 0.01 if busy else 0.2)
            if self.broken is not None:
                raise self.broken
            if msgs:
                self.intake.admit(msgs)
            now = time.monotonic()
            if commit_due(now - last_commit, self.ledger.completed, len(self.sched),
                          self.dispatch.running, self.slow_start.cap(now),
                          self.s.commit_interval_s):
                await self._kafka(self._commit)
                last_commit = now
            self.intake.sweep_parked(now)
            self.policy.forget_idle(now)
            self._report()

    def _report(self) -> None:
        self.status.gauges.update(self.policy.memory_counts())
        self.status.gauges.update(inflight=self.dispatch.running, queued=len(self.sched),
                                  parked=self.parked.total(), seen_keys=len(self.seen),
                                  uncommitted=self.ledger.uncommitted,
                                  paused=int(self.paused),
                                  restoring=len(self.restorer.waiting),
                                  restore_failing=len(self.restorer.failing))
        if self.dispatch.running or len(self.sched):
            self.status.add("busy_ticks")
        self.status.write()

    # --- live control: caps and paused targets ---------------------------------------------

    def _base_interval(self, target: str) -> float:
        """Interval for a target given a slot (the policy's); hold it if it is paused."""
        if self.control is not None and self.control.state.target_paused(target):
            self.loop.call_soon(self.sched.hold, target)
        return self.policy.base_interval(target)

    def _cap(self, target: str) -> float:
        live = self.control.state.caps.get(target) if self.control is not None else None
        return live or self.s.cap_for(target)


