"""Fetch stage: frontier jobs → polite HTTP fetches → FetchResult, retry or dead letter.

One asyncio loop runs many fetches at once; one dedicated thread makes every Kafka call
(poll, rebalance callbacks, transactional commits), so callbacks and commits never
overlap. This module only wires the parts:

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
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from consumers.classify import Signal
from consumers.http_fetch import Fetcher
from consumers.outcomes import OutcomeRules, Result
from consumers.pacer import Pacer
from consumers.parking import ParkedQueues, encode_job, park_key
from consumers.robots import UNREACHABLE_RETRY_S
from consumers.robots_cache import RobotsCache
from consumers.scheduler import TargetScheduler
from consumers.scope import OUT_OF_SCOPE, REROUTE, recheck
from consumers.seen import SeenStore
from consumers.target_policy import TargetPolicy
from crawlfleet.config import Settings
from crawlfleet.errors import (
    CrawlfleetError,
    DecodeError,
    InvalidURLError,
    KafkaStageError,
    RobotsDisallowedError,
)
from crawlfleet.urls import canonicalize, target_of
from infra.topics import topology_of
from producers.lineage import DUPLICATE, PARKED, lineage_event
from producers.replay import job_dedupe_key
from schemas.records import CrawlJob
from schemas.topics import partition_for
from streams.committer import FencedError, TxnCommitter, on_kafka_thread
from streams.control import ControlReader, backlog_key
from streams.io import (
    Encoder,
    Output,
    consume_ready,
    consumer_conf,
    offset_of,
    stable_committed,
    tp_of,
)
from streams.ledger import Ledger, Pending, StoreChange
from streams.membership import Membership
from streams.restorer import Restored, Restorer
from streams.slow_start import SlowStart
from streams.state_store import StateStore
from streams.status import PollGaps, StatusFile
from streams.worker import StopFlag, wait_for_kafka, worker_name

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
#: Targets with parked work and nothing in memory are looked for this often: a refill is
#: otherwise triggered by the target's own events (a job finishing, a commit, a restore,
#: the end of a rest), and a target with none left must not strand its parked queue.
REFILL_SWEEP_S = 5.0
#: A session that failed waits this long before the next one joins (the rejoin is within
#: the session timeout, so static membership keeps the partitions).
REJOIN_PAUSE_S = 1.0
#: Expired dedupe keys are swept from the local store (a slice at a time) this often.
SWEEP_EVERY_S = 10.0


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

    def state_dir(self, store: str) -> Path:
        return self.s.data_dir / store / (self.s.topic_prefix.rstrip(".") or "default") \
            / self.worker


def _parked_transform(enc: Encoder) -> Callable[[Message], bytes | None]:
    """Changelog record (Avro CrawlJob) → the parked store's bytes (compact JSON)."""
    def transform(msg: Message) -> bytes | None:
        try:
            return encode_job(enc.decode_job(msg))
        except DecodeError:
            return None
    return transform


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
        self.seen = SeenStore(stage.state_dir("seen"), ttl_s=self.s.seen_ttl_s)
        self.membership = Membership(self.topo, "fetch")
        self.restorer = Restorer("fetch", self._restore)
        self.sweep_at = 0.0
        self.parked = ParkedQueues(StateStore("parked", stage.state_dir("parked")),
                                   self.topo.partitions)
        self.robots = RobotsCache(self.s.robots_agent, self.s.robots_ttl_s,
                                  lambda t, i: self.policy.on_robots(t, i),
                                  max_origins=self.s.max_target_state)
        self.policy = TargetPolicy(self.s, self.sched, self.robots, self._cap,
                                   self.status.add)
        self.refill_sweep_at = time.monotonic() + REFILL_SWEEP_S
        self.running = 0
        self.paused = False
        self.wake = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        self.consumer: Consumer | None = None
        self.broken: CrawlfleetError | None = None  # set by a rebalance callback
        self.control: ControlReader | None = None
        self.ctl_paused = False
        self.pacer = Pacer(self.s.fleet_rate_cap)
        self.members_stale = False
        self.admin: AdminClient | None = None
        self.committer: TxnCommitter | None = None
        self.slow_start = SlowStart(floor=150)  # outputs (~3 per page) per transaction
        self._allowed = frozenset(self.s.allowed_targets)
        self.poll_gaps = PollGaps(self.status)
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
        self.ctl_paused = self.control.state.paused
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

    def _restore(self, parts: set[int]) -> tuple[set[int], Any]:
        """Restore thread: the seen and parked stores of ``parts``, and the group's committed
        offsets (read after any pending transactional ones settled, KIP-447)."""
        began = time.monotonic()
        for p in parts:  # a leftover DB (a cancelled restore) is reopened from its checkpoint
            self.seen.drop(p)
            self.parked.dropped(p)
            self.parked.store.drop(p)
        offsets = stable_committed(self.s, self.topo.group("fetch"), self.membership.expand(
            [TopicPartition(self.topo.frontier, p) for p in parts]))
        timeout = self.s.restore_timeout_s
        n, failed = self.seen.restore_partitions(self.s, self.topo.seen, sorted(parts),
                                                 self.enc.codec, timeout)
        failed |= self.parked.store.restore(self.s, self.topo.parked, sorted(parts - failed),
                                            _parked_transform(self.enc), timeout)
        targets = [t for p in sorted(parts - failed) for t in self.parked.restored(p)]
        return failed, (offsets, targets, n, time.monotonic() - began)

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
        if tps and not (self.paused or self.ctl_paused):
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
            self.loop.call_soon_threadsafe(self._refill_many, targets)

    def _refresh_members(self) -> None:
        """Re-read the fetch group's live membership after a rebalance (fleet-wide cap)."""
        group = self.topo.group("fetch")
        if self.admin is None:
            self.admin = AdminClient(self.s.kafka_common())
        try:
            desc = self.admin.describe_consumer_groups([group])[group].result(timeout=2)
        except (KafkaException, TimeoutError):
            return  # still rebalancing: keep the previous share and try again next poll
        if desc.members:
            mine = total = 0
            for m in desc.members:
                parts = {tp.partition for tp in (m.assignment.topic_partitions
                                                 if m.assignment else [])}
                total += len(parts)
                if m.client_id == self.st.worker:
                    mine = len(parts)
            self.pacer.set_members(len(desc.members), mine, total)
            self.status.gauges["members"] = len(desc.members)
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
        owned = self.ledger.forget(revoked) | self.restorer.waiting
        for part in self.seen.partitions() - owned:
            self.seen.drop(part)
        for part in self.parked.store.partitions() - owned:
            self.parked.dropped(part)
            self.parked.store.drop(part)
        self.loop.call_soon_threadsafe(self._drop_stale)

    def _commit(self, use_positions: bool = True) -> None:
        assert self.consumer is not None and self.committer is not None
        positions = {(p.topic, p.partition): p.offset
                     for p in self.consumer.position(self.consumer.assignment())} \
            if use_positions else {}
        batch = self.ledger.take_commit(positions)
        if batch is None:
            return
        batch.outputs += self._backlog_reports()
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
        # Each store applies this transaction's writes and moves its checkpoint past them.
        self.seen.put_many(((p, k, st, a) for (p, k), (st, a) in batch.seen.items()),
                           {p: o + 1 for (t, p), o in written.items() if t == self.topo.seen})
        gained = self.parked.committed(batch.changes)
        self.parked.store.advance({p: o + 1 for (t, p), o in written.items()
                                   if t == self.topo.parked})
        self.ledger.committed(batch)
        self.slow_start.committed(len(batch.outputs))
        self.status.add("committed_txns")
        self.status.add("produced", len(batch.outputs))
        if gained:
            self.loop.call_soon_threadsafe(self._refill_many, gained)

    def _backlog_reports(self) -> list[Output]:
        """The parked backlog of partitions whose count changed, for the frontier bound
        (``crawl.control``, compacted: the latest count per partition is what stays)."""
        return [self.enc.control(backlog_key(part), {
                    "kind": "backlog", "target": None, "value": float(count), "text": None,
                    "issued_by": self.st.worker} if count > 0 else None)
                for part, count in self.parked.backlog_changes().items()]

    def _poll(self, timeout: float) -> list[Message]:
        assert self.consumer is not None and self.control is not None
        changed = self.control.poll(0)
        for done in self.restorer.finished():
            self._restored(done)
        if self.members_stale:
            self._refresh_members()
        now = time.monotonic()
        if now >= self.sweep_at:  # expired dedupe keys give their disk back, a slice a time
            self.sweep_at = now + SWEEP_EVERY_S
            self.status.add("seen_expired", self.seen.sweep())
        # Memory is bounded per target (work beyond a share is parked), so the worker as a
        # whole is full only when many targets are each at their share.
        buffered = len(self.sched) + self.running
        full = buffered >= self.s.max_buffered or (
            self.paused and buffered >= self.s.max_buffered // 2)
        want_paused = full or self.control.state.paused
        if want_paused != (self.paused or self.ctl_paused):
            if want_paused:
                self.consumer.pause(self.consumer.assignment())
            else:  # not the partitions still waiting for their restore
                waiting = self.restorer.waiting
                self.consumer.resume([tp for tp in self.consumer.assignment()
                                      if tp.partition not in waiting])
        self.paused, self.ctl_paused = full, self.control.state.paused
        if changed:
            self.loop.call_soon_threadsafe(self._apply_control)
        self.poll_gaps.tick()
        return consume_ready(self.consumer, 500, timeout)

    def _apply_control(self) -> None:
        """Loop thread: re-derive target holds and intervals from the control state."""
        assert self.control is not None
        state = self.control.state
        now = time.monotonic()
        for target in self.sched.targets():
            if state.target_paused(target):
                self.sched.hold(target)
            else:
                self.sched.release(target, now)
            self.sched.set_interval(target, self.policy.interval(target))
        self.wake.set()

    # --- event loop ---------------------------------------------------------------------

    async def run(self) -> None:
        await self._kafka(self._setup)
        try:
            async with Fetcher(self.s) as fetcher:
                self.fetcher = fetcher
                self.robots.fetcher = fetcher
                dispatcher = asyncio.create_task(self._dispatch_loop())
                try:
                    await self._main_loop()
                finally:
                    dispatcher.cancel()
                    for t in list(self.tasks):
                        t.cancel()
                    await asyncio.gather(dispatcher, *self.tasks, return_exceptions=True)
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
        self.seen.close()
        self.parked.store.close()
        if self.control is not None:
            self.control.close()

    async def _main_loop(self) -> None:
        last_commit = time.monotonic()
        while not self.st.stop.requested:
            # Jobs queued, in flight or finished but uncommitted: look again soon, so results
            # are committed (handed on) as soon as the last of them is done. A poll cannot be
            # woken early, and a job queued now is often done within a millisecond: a longer
            # wait here was most of each hop of a chain-like crawl (50 of its ~60 ms).
            busy = self.running or self.ledger.completed or len(self.sched)
            msgs = await self._kafka(self._poll, 0.01 if busy else 0.2)
            if self.broken is not None:
                raise self.broken
            if msgs:
                self._admit(msgs)
            now = time.monotonic()
            # Under load, commit on the interval (fewer, fuller transactions). With nothing
            # queued to start, the crawl is waiting on the links in our results: hand them
            # on every _STARVED_COMMIT_S, and at once when nothing is in flight either.
            done = self.ledger.completed
            starved = bool(done) and not len(self.sched) and (
                not self.running or now - last_commit >= _STARVED_COMMIT_S)
            # After a quiet spell, results go out in growing transactions (slow start), so
            # a crawl's next level is found while this one is still being fetched.
            burst = done >= self.slow_start.cap(now)
            if now - last_commit >= self.s.commit_interval_s or starved or burst:
                await self._kafka(self._commit)
                last_commit = now
            self._sweep_parked(now)
            self.policy.forget_idle(now)
            self._report()

    def _report(self) -> None:
        self.status.gauges.update(self.policy.memory_counts())
        self.status.gauges.update(inflight=self.running, queued=len(self.sched),
                                  parked=self.parked.total(), seen_keys=len(self.seen),
                                  uncommitted=self.ledger.uncommitted,
                                  paused=int(self.paused),
                                  restoring=len(self.restorer.waiting),
                                  restore_failing=len(self.restorer.failing))
        if self.running or len(self.sched):
            self.status.add("busy_ticks")
        self.status.write()

    def _admit(self, msgs: list[Message]) -> None:
        now = time.monotonic()
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", err)
                continue
            tp, offset = tp_of(msg), offset_of(msg)
            epoch = self.ledger.admit(tp, offset)
            if epoch is None:
                continue  # revoked between fetch and delivery
            self.status.add("consumed")
            try:
                job = self.enc.decode_job(msg)
                job["url"] = canonicalize(job["url"])
            except DecodeError as exc:
                self.status.metrics.dead_letter(exc.reason)
                self._finish_raw(tp, offset, epoch, [self.enc.undecodable(msg, exc)])
                continue
            except InvalidURLError as exc:
                self.status.metrics.dead_letter(exc.reason)
                self._finish_raw(tp, offset, epoch, [
                    self.enc.dead(job, None, tp[0], exc.reason, str(exc), job["attempt"])])
                continue
            verdict = recheck(job, scope=self.s.scope, target_mode=self.s.target_mode,
                              allowed=self._allowed)
            if verdict is not None:
                self._misplaced(tp, offset, epoch, job, verdict)
                continue
            pj = Pending(tp, offset, epoch, job, job_dedupe_key(job))
            if self.ledger.is_duplicate(pj, self.seen.get):
                self.status.add("skipped_seen")
                self.ledger.finish(pj, [self._duplicate(pj)], None)
                continue
            target, tier = pj.target, self._tier_of(tp)
            if self.policy.must_park(target, tier, now, self.parked.must_park(target, tier)):
                self._park(pj)  # it comes back with a refill
                continue
            self.ledger.hold(pj)
            self.sched.push(target, pj, now, tier=pj.tier)
        self.wake.set()

    # --- per-target memory: share, park, refill -------------------------------------------

    def _tier_of(self, tp: TP) -> int:
        return 1 if tp[0] == self.topo.frontier_high else 0

    def _park(self, pj: Pending) -> None:
        """Send a job to disk: a frontier record is written to the parked changelog with
        its offset's commit; one taken from disk just goes back (its entry is still there)."""
        if pj.park_key is not None:
            self.ledger.release(pj)
            self.parked.untake(pj.park_key)
            return
        self.ledger.release(pj)  # before it gets its park key: that changes its identity
        if not self.ledger.current(pj.tp, pj.epoch):
            return
        pj.park_key = park_key(pj.target, self._tier_of(pj.tp), pj.offset)
        change = self.parked.park(pj.tp[1], pj.park_key, pj.job)
        parked = [self.rules.park(pj), lineage_event(self.enc, pj.job, PARKED, "fetch")]
        if not self.ledger.finish(pj, parked, None, [change]):
            self.parked.aborted([change])
        self.status.add("parked")

    def _duplicate(self, pj: Pending) -> Output:
        """The lineage event of a job suppressed by its dedupe key (with the state it met)."""
        state = self.seen.get(pj.tp[1], pj.key)
        return lineage_event(self.enc, pj.job, DUPLICATE, "fetch",
                             state[0].lower() if state else "in flight")

    def _shed(self, target: str, keep: int) -> None:
        """Move ``target``'s queued jobs beyond its first ``keep`` to disk."""
        for pj in self.sched.take_tail(target, keep):
            self._park(pj)

    def _home_tp(self, partition: int) -> TP | None:
        for topic in (self.topo.frontier, self.topo.frontier_high):
            if self.ledger.owns((topic, partition)):
                return topic, partition
        return None

    def _refill_many(self, targets: Iterable[str]) -> None:
        for t in targets:
            self._refill(t)
        self.wake.set()

    def _refill(self, target: str) -> None:
        """Bring ``target``'s oldest parked jobs back while it has room in its share."""
        if self.parked.available(target) <= 0:
            return
        now = time.monotonic()
        if self.policy.resting(target, now):
            return  # resting: due_wakes brings it back
        if not self.policy.room_for(target, now):
            return  # the refill sweep tries again
        part = partition_for(target, self.topo.partitions)
        tp = self._home_tp(part)
        epoch = self.ledger.epoch_of(tp) if tp is not None else None
        if tp is None or epoch is None:
            return
        share = self.policy.share(target)
        for tier in (1, 0):
            held = self.policy.held(target, tier)
            room = share - held
            if room <= 0 or (held and room < share // 2):
                continue  # refill in batches, not one scan per finished job
            for key, job in self.parked.take(part, target, tier, room):
                pj = Pending(tp, -1, epoch, job, job_dedupe_key(job), park_key=key)
                if self.ledger.is_duplicate(pj, self.seen.get):
                    self.status.add("skipped_seen")
                    self._finish(pj, [self._duplicate(pj)], None)  # only its entry goes
                    continue
                self.ledger.hold(pj)
                self.sched.push(target, pj, now, tier=pj.tier)
                self.status.add("unparked")

    def _refill_due(self, now: float) -> None:
        for target in self.policy.due_wakes(now):
            self._refill(target)

    def _sweep_parked(self, now: float) -> None:
        """Refill targets that have parked work and nothing in memory (main loop)."""
        if now < self.refill_sweep_at:
            return
        self.refill_sweep_at = now + REFILL_SWEEP_S
        for target in self.parked.waiting_targets():
            if not self.policy.held(target, 0) and not self.policy.held(target, 1):
                self.status.add("refill_sweeps")
                self._refill(target)
                self.wake.set()

    # --- rates: cap, robots, adaptive -----------------------------------------------------

    def _base_interval(self, target: str) -> float:
        """Interval for a target given a slot (the policy's); hold it if it is paused."""
        if self.control is not None and self.control.state.target_paused(target):
            self.loop.call_soon(self.sched.hold, target)
        return self.policy.base_interval(target)

    def _cap(self, target: str) -> float:
        live = self.control.state.caps.get(target) if self.control is not None else None
        return live or self.s.cap_for(target)

    def _observe(self, target: str, result: Result) -> None:
        """Feed a request's signal to the target's policy; do the rest and shedding it asks."""
        now = time.monotonic()
        seen = self.policy.observe(target, result.signal, result.retry_after_s, now)
        if result.signal not in (Signal.OK, Signal.NEUTRAL):
            self.status.add(f"signal_{result.signal.value}")
        if seen.shed_to is not None:
            self._shed(target, seen.shed_to)
        if seen.wait > 0:
            self._defer(target, seen.wait, now)

    def _defer(self, target: str, wait: float, now: float) -> None:
        """No request to ``target`` for ``wait`` s; a long rest sends its queue to disk."""
        self.status.add("deferrals")
        if self.policy.defer(target, wait, now):
            self._shed(target, 0)

    # --- dispatch -------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            now = time.monotonic()
            self._refill_due(now)
            free = self.s.max_inflight - self.running
            if self.ctl_paused:
                free = 0  # a person paused the fleet: finish what is in flight, start nothing
            free = self.pacer.available(now, free)
            if free > 0:
                started = 0
                for target, pj in self.sched.pop_ready(now, free):
                    if not self.ledger.current(pj.tp, pj.epoch):
                        self.ledger.release(pj)
                        self.sched.done(target, now)
                        continue  # partition moved away: the new owner redoes it
                    if target in self.policy.windows and self._outside_window(target, pj, now):
                        self.sched.done(target, now)
                        continue
                    if self._disallowed_now(target, pj, now):
                        self.sched.done(target, now)
                        continue
                    self.running += 1
                    started += 1
                    task = asyncio.create_task(self._fetch(pj))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                self.pacer.take(now, started)
            due, wake = self.sched.next_due(), self.policy.next_wake()
            if wake is not None:
                due = wake if due is None else min(due, wake)
            paced = self.pacer.next_at()
            if due is not None and paced is not None:
                due = max(due, paced)
            timeout = None if due is None or self.running >= self.s.max_inflight \
                or self.ctl_paused else max(0.0, due - time.monotonic())
            self.wake.clear()
            # asyncio.timeout, not wait_for: this runs once per finished request, and
            # wait_for wraps every wait in a new Task.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wake.wait()

    def _disallowed_now(self, target: str, pj: Pending, now: float) -> bool:
        """Known robots-disallowed: dead-letter it without spending the target's slot."""
        rules = self.robots.known(pj.job["url"])
        if rules is None or rules.unreachable:
            return False
        if rules.allows(pj.job["url"], self.s.robots_agent):
            pj.allowed_by = rules  # _fetch need not ask protego again
            return False
        self.sched.refund(target, now)
        res = self.rules.dead(pj, "robots_disallowed", f"robots.txt disallows {pj.job['url']}",
                              0, now)
        self.status.metrics.dead_letter(res.reason)
        self._finish(pj, res.outputs, res.seen)
        self._refill(target)
        return True

    def _outside_window(self, target: str, pj: Pending, now: float) -> bool:
        """Outside the target's crawl window the job waits (queued or parked), never dropped."""
        wait = self.policy.window_wait(target, datetime.now(UTC))
        if wait <= 0:
            return False
        self.sched.push_front(target, pj, now, tier=pj.tier)
        self.status.add("outside_window")
        self._defer(target, wait, now)
        return True

    def _drop_stale(self) -> None:
        """Forget queued jobs of partitions this worker no longer owns."""
        def keep(pj: Pending) -> bool:
            if self.ledger.current(pj.tp, pj.epoch):
                return True
            self.ledger.release(pj)
            return False
        self.sched.drop(keep)
        self.ledger.drop_holders(self.ledger.current)
        self.wake.set()

    # --- one job ------------------------------------------------------------------------

    async def _fetch(self, pj: Pending) -> None:
        job, target = pj.job, pj.target
        started = time.monotonic()
        result: Result | None = None
        answered = -1  # no page request sent; 0: sent, no answer; else the answer's status
        try:
            rules = await self.robots.rules_for(job["url"], target)
            if rules is None:  # this slot was spent on robots.txt: go again later
                now = time.monotonic()
                self.sched.push_front(target, pj, now, tier=pj.tier)
                # A full interval after the answer, not after the release: the robots.txt
                # request may have left late (a burst of new targets), and the site counts
                # the gap between the requests it saw.
                self.sched.defer(target, now + self.policy.interval(target))
                return
            if rules.unreachable:
                result = self.rules.retry_or_dead(pj, "robots_unreachable",
                                                  UNREACHABLE_RETRY_S, 0, started)
                if self.sched.queued(target) or any(  # parked: committed or not
                        self.parked.must_park(target, tier) for tier in (0, 1)):
                    # Its other jobs wait out the retry time. A target with none left
                    # rests no slot: its cached rules answer a next job until then, so
                    # it can be forgotten like any idle target (a minted host, say).
                    self._defer(target, UNREACHABLE_RETRY_S, time.monotonic())
            elif rules is not pj.allowed_by and not rules.allows(job["url"],
                                                                  self.s.robots_agent):
                raise RobotsDisallowedError(f"robots.txt disallows {job['url']}")
            else:
                answered = 0
                resp = await self.fetcher.get(job["url"])
                answered = resp.status
                result = self.rules.response(pj, resp, started)
        except CrawlfleetError as exc:
            result = self.rules.error(pj, exc, started)
        except Exception as exc:  # a bug must not leave the job unfinished, pinning offsets
            log.exception("fetch of %s failed unexpectedly", job["url"])
            result = self.rules.dead(pj, "internal", f"{type(exc).__name__}: {exc}", 0,
                                     started)
        finally:
            self.running -= 1
            self.sched.done(target, time.monotonic())
            self.wake.set()
        if result is None:
            return
        self._observe(target, result)
        if answered >= 0:
            self.status.metrics.request(result.outcome, answered, time.monotonic() - started)
        if result.outputs and result.outputs[0].topic == self.topo.fetched:
            self.status.add("fetched")
        elif result.seen[0] == "RETRYING":
            self.status.add("retries")
        else:
            self.status.add("dead")
            self.status.metrics.dead_letter(result.reason)
        self._finish(pj, result.outputs, result.seen)
        self._refill(target)

    def _finish(self, pj: Pending, outputs: list[Any], seen: tuple[str, int] | None) -> None:
        changes: list[StoreChange] = []
        if seen is not None:
            outputs = [*outputs, self.rules.seen(pj, seen)]
        if pj.park_key is not None:  # it leaves the parked queue with this transaction
            outputs = [*outputs, self.rules.unpark(pj)]
            changes.append((pj.tp[1], pj.park_key, None))
        if not self.ledger.finish(pj, outputs, seen, changes) and pj.park_key is not None:
            self.parked.untake(pj.park_key)

    def _misplaced(self, tp: TP, offset: int, epoch: int, job: CrawlJob,
                   verdict: str) -> None:
        """A job today's rules place elsewhere: sent on under its URL's own target (its cap,
        its partition), or dead-lettered ``out_of_scope`` -- never fetched here as it was."""
        if verdict == REROUTE:
            job = {**job, "target": target_of(job["url"], self.s.target_mode)}
            topic = self.topo.frontier_high if job.get("priority", 0) > 0 \
                else self.topo.frontier
            if self.ledger.finish_raw(tp, offset, epoch, [self.enc.job(topic, job)]):
                self.status.add("rerouted")
            return
        self.status.metrics.dead_letter(OUT_OF_SCOPE)
        self._finish_raw(tp, offset, epoch, [self.enc.dead(
            job, None, tp[0], OUT_OF_SCOPE, f"{job['url']} is out of scope {self.s.scope!r} "
            f"of the page that led to it ({job.get('parent_url')})", job["attempt"])])

    def _finish_raw(self, tp: TP, offset: int, epoch: int, outputs: list[Any]) -> None:
        if self.ledger.finish_raw(tp, offset, epoch, outputs):
            self.status.add("dead")
