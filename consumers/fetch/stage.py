"""Fetch stage: frontier jobs → polite HTTP fetches → FetchResult, retry or dead letter.

One asyncio loop runs many fetches at once on the asyncio runtime
(:class:`streams.async_session.AsyncSession`: every Kafka call on one thread, rebalances,
restores, commits, flow control). This module is the stage's crawl logic and its wiring
(``_Session``):

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
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any

from consumers.fetch.dispatch import Dispatcher
from consumers.fetch.http import Fetcher
from consumers.fetch.intake import Intake
from consumers.fetch.outcomes import OutcomeRules
from consumers.fetch.parking import ParkedQueues
from consumers.fetch.quarantine_holds import summary
from consumers.fetch.seen import SeenStore
from consumers.fetch.stores import FetchStores
from consumers.fetch.targets import Targets
from consumers.fetch.wiring import FetchWiring
from schemas.stages import stage_spec
from schemas.topics import partition_for
from streams.async_session import AsyncSession, SessionRole
from streams.control import ControlState
from streams.idle_poll import IdlePoll
from streams.io import Output
from streams.ledger import CommitBatch, Ledger
from streams.membership import Membership
from streams.restorer import Restored
from streams.slow_start import SlowStart
from streams.stage import Stage
from streams.store_open import open_declared

log = logging.getLogger("crawlfleet.fetch")
TP = tuple[str, int]
#: A worker out of queued jobs hands its results on this often, not on the full interval.
_STARVED_COMMIT_S = 0.1
#: The main loop's poll with requests in flight, and its longest with jobs only queued.
_BUSY_POLL_S, _QUEUED_POLL_S = 0.01, 0.2
#: The status file is written at least this often, whatever the main loop waits on.
REPORT_EVERY_S = 0.5
#: The longest a revoke waits for the moved partitions' requests to be aborted.
ABORT_WAIT_S = 5.0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed: a cheaper loop per request on the busiest stage."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class FetchStage(Stage):
    stage = "fetch"

    def session(self) -> None:
        """One membership on a fresh event loop: everything uncommitted is dropped with it,
        and the next one restores its state and offsets from what is committed."""
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(self._session())

    async def _session(self) -> None:
        await _Session(self).run()  # made on the loop: its parts take the running loop


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


def poll_wait_s(now: float, running: int, completed: int, queued: int,
                next_due: float | None, commit_at: float, idle_s: float) -> float:
    """How long the main loop's next poll may wait (a poll cannot be woken early).

    A request in flight may finish any moment, and its result is handed on as soon as it
    is due (``commit_due``): a short poll. Jobs queued but waiting for their target's slot
    (a polite crawl, nearly always) need the loop only when the next may start or the
    finished ones are due to be committed: until then, up to 0.2 s -- at 2 requests/s a
    100 Hz loop was most of a polite fetch worker's CPU (issue 43). Nothing at all: the
    stage's idle wait (``idle_s``).
    """
    if running:
        return _BUSY_POLL_S
    wake = [commit_at] if completed else []
    if queued and next_due is not None:
        wake.append(next_due)
    if not wake:
        return _BUSY_POLL_S if queued and not completed else idle_s
    return min(_QUEUED_POLL_S, max(_BUSY_POLL_S, min(wake) - now))


class _Session:
    """One membership of the group: the crawl logic's parts, all dropped together, wired
    to the asyncio runtime (which calls back through the SessionLogic methods below)."""

    def __init__(self, stage: FetchStage) -> None:
        self.st = stage
        self.s = stage.s
        self.topo = stage.topology
        self.enc = stage.encoder
        self.status = stage.status
        self.loop = asyncio.get_running_loop()
        self.ledger = Ledger()
        self.rules = OutcomeRules(self.s, self.topo, self.enc, stage.worker)
        #: Partitions taken over with committed progress (another owner, or an earlier life
        #: of this worker, worked them), by when: their targets' first requests wait.
        self.taken_over: dict[int, float] = {}
        spec = stage_spec(stage.stage)  # its stores, opened as declared
        self.seen = SeenStore.declared(spec.store("seen"), self.s, stage.worker)
        self.parked = ParkedQueues(open_declared(spec.store("parked"), self.s, stage.worker),
                                   self.topo.partitions)
        self.stores = FetchStores(self.s, self.topo, self.enc, self.seen, self.parked,
                                  Membership(self.topo, "fetch"))
        #: Every target's state: asked what may go next, told what happened.
        self.targets = Targets(self.s, self.parked, self.status, lambda t: self.taken_over.get(
            partition_for(t, self.topo.partitions), float("-inf")))
        # Its parts, named for the tests and gauges that read them.
        self.sched, self.policy = self.targets.sched, self.targets.policy
        self.robots, self.pacer = self.targets.robots, self.targets.pacer
        self.wake = asyncio.Event()
        self.idle = IdlePoll()
        self.slow_start = SlowStart(floor=150)  # outputs (~3 per page) per transaction
        wiring = FetchWiring(self.s, self.topo, self.enc, self.ledger, self.rules, self.status,
                             self.wake)
        self.intake = Intake(wiring, self.targets, self.seen, self.parked)
        self.dispatch = Dispatcher(wiring, self.targets, self.intake)
        self.dispatch.stopping = lambda: stage.stop.requested
        self.kafka = AsyncSession(SessionRole.of(stage), self.ledger, self,
                                  frozenset({self.topo.seen, self.topo.parked}),
                                  track_members=self.s.fleet_rate_cap > 0)
        self.targets.latest = lambda: self.kafka.control_state
        self.dispatch.commit_age = self.kafka.commit_age
        self.status.gauge_fns["deferred_targets"] = \
            lambda: self.policy.deferred_targets(time.monotonic())
        self.status.gauge_fns["egress_cooling"] = \
            lambda: len(self.policy.identities.health.cooling(time.monotonic()))
        self.status.gauge_fns["quarantine_held"] = self._quarantine_held

    def _quarantine_held(self) -> int:
        """Jobs a quarantine holds (the gauge), and per target how many until when (the
        note ``crawl`` and ``top`` show)."""
        held = self.targets.held_by_quarantine()
        self.status.notes["quarantine_held"] = summary(
            held, self.targets.quarantines(), int(time.time() * 1000))
        return sum(held.values())

    # --- SessionLogic: the runtime's questions, on the Kafka thread ------------------------

    def restore(self, parts: set[int]) -> tuple[set[int], dict[TP, int], Any]:
        failed, (offsets, targets, records, seconds) = self.stores.restore(parts)
        worked = {p for (_, p), offset in offsets.items() if offset >= 0}
        return failed, offsets, (targets, records, seconds, worked)

    def restored(self, done: Restored, info: Any) -> None:
        targets, records, seconds, worked = info if info is not None \
            else ([], 0, 0.0, set())
        self.status.add("seen_restored", records)
        self.status.add("restore_ms", int(seconds * 1000))
        for p in done.failed:
            self.parked.dropped(p)
        if worked & done.complete:
            self.loop.call_soon_threadsafe(self._handover, worked & done.complete)
        if targets:
            self.loop.call_soon_threadsafe(self.intake.refill_many, targets)

    def _handover(self, parts: set[int]) -> None:
        """Event loop: ``parts`` were worked by an owner before this one (a restart, a
        rebalance), which may have sent to their targets a moment ago: each target's first
        request here leaves an interval after now. A brand-new crawl's partitions have no
        committed progress and start at once."""
        now = time.monotonic()
        for p in parts:
            self.taken_over[p] = now
        self.targets.handover(lambda t: partition_for(t, self.topo.partitions) in parts, now)

    def keep_only(self, owned: set[int]) -> None:
        """Kafka thread, in a revoke (or loss): drop the moved partitions' state, and abort
        their requests not yet sent before the callback returns (the partitions move then)."""
        self.stores.keep_only(owned)
        self.loop.call_soon_threadsafe(self.dispatch.keep_only, set(owned))
        self._abort_moved()

    def _abort_moved(self) -> None:
        """Wait (on the Kafka thread, at most ``ABORT_WAIT_S``) until every request task of
        a moved partition has ended: a revoke that returned with one still waiting for its
        send slot let it send beside the new owner's first requests (one host, two workers,
        over its cap)."""
        if self.loop.is_closed():
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not on a loop: the Kafka thread, as a revoke runs
            pass
        else:  # on the loop itself (a test): it cannot be waited for here
            self.loop.create_task(self.dispatch.abort_moved())
            return
        fut = asyncio.run_coroutine_threadsafe(self.dispatch.abort_moved(), self.loop)
        try:
            aborted = fut.result(ABORT_WAIT_S)
        except concurrent.futures.TimeoutError:
            log.warning("fetch %s: requests of moved partitions did not end within %.0f s "
                        "(each still checks its partition before it sends)", self.st.worker,
                        ABORT_WAIT_S)
            self.status.add("revoke_abort_timeouts")
            return
        if aborted:
            self.status.add("revoke_aborted", aborted)

    def commit_outputs(self) -> list[Output]:
        return self.intake.backlog_reports(self.st.worker)

    def committed(self, batch: CommitBatch, written: dict[TP, int]) -> None:
        gained = self.stores.committed(batch, written)
        self.slow_start.committed(len(batch.outputs))
        if gained:
            self.loop.call_soon_threadsafe(self.intake.refill_many, gained)

    def aborted(self, batch: CommitBatch) -> None:
        self.parked.aborted(batch.changes)

    def full(self, paused: bool) -> bool:
        """Memory is bounded per target (work beyond a share is parked), so the worker as a
        whole is full only when many targets are each at their share."""
        buffered = self.targets.buffered() + self.dispatch.running
        return buffered >= self.s.max_buffered or (
            paused and buffered >= self.s.max_buffered // 2)

    def tick(self, now: float) -> None:
        swept = self.stores.sweep_expired(now)
        if swept is not None:
            self.status.add("seen_expired", swept)

    def control_changed(self, state: ControlState) -> None:
        self.dispatch.paused = state.paused
        self.loop.call_soon_threadsafe(self.dispatch.apply_control, state)

    def members_changed(self, members: int, mine: int, total: int) -> None:
        self.pacer.set_members(members, mine, total)

    # --- event loop ---------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self.kafka.start()
            async with Fetcher(self.s) as fetcher:
                self.dispatch.fetcher = fetcher
                self.robots.fetcher = fetcher
                dispatcher = asyncio.create_task(self.dispatch.dispatch_loop())
                reporter = asyncio.create_task(self._report_loop())
                try:
                    await self._main_loop()
                finally:
                    dispatcher.cancel()
                    reporter.cancel()
                    for t in list(self.dispatch.tasks):
                        t.cancel()
                    await asyncio.gather(dispatcher, reporter, *self.dispatch.tasks,
                                         return_exceptions=True)
        finally:
            try:
                await self.kafka.close()
            finally:
                self.stores.close()

    async def _main_loop(self) -> None:
        last_commit = time.monotonic()
        while not self.st.stop.requested:
            # Jobs queued, in flight or finished but uncommitted: look again soon, so results
            # are committed (handed on) as soon as the last of them is done. A poll cannot be
            # woken early, and a job queued now is often done within a millisecond: a longer
            # wait here was most of each hop of a chain-like crawl (50 of its ~60 ms).
            busy = self.dispatch.running or self.ledger.completed or len(self.sched)
            # Long idle (nothing parked or uncommitted either): a longer poll, which a
            # record still ends at once (streams.idle_poll).
            held = busy or self.ledger.uncommitted or self.parked.total() or self.kafka.paused \
                or self.kafka.control_paused
            now = time.monotonic()
            # when commit_due turns true with nothing in flight: at once unless jobs wait
            commit_at = last_commit + self.s.commit_interval_s if len(self.sched) and \
                self.ledger.completed < self.slow_start.cap(now) else now
            # paused: its queued jobs start at no slot, so none needs the loop
            queued = 0 if self.dispatch.paused else len(self.sched)
            wait_s = _BUSY_POLL_S if self.dispatch.held_for_commit else poll_wait_s(
                now, self.dispatch.running, self.ledger.completed, queued,
                self.targets.next_due(), commit_at, self.idle.timeout(0.2, bool(held)))
            msgs = await self.kafka.poll(wait_s)
            if msgs:
                self.idle.took()
                self.intake.admit(msgs)
            now = time.monotonic()
            if commit_due(now - last_commit, self.ledger.completed, len(self.sched),
                          self.dispatch.running, self.slow_start.cap(now),
                          self.s.commit_interval_s):
                await self.kafka.commit()
                last_commit = now
                self.wake.set()  # a dispatcher held for this commit may start again
            self.intake.sweep_parked(now)
            self.targets.forget_idle(now)
            self._report()

    async def _report_loop(self) -> None:
        """The status file, also while the main loop waits on a commit: a commit that
        stalls must not leave the last word on what this worker holds minutes old (the
        fleet's drain check and the chaos bound read it)."""
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            self._report()

    def _report(self) -> None:
        self.status.gauges.update(self.policy.memory_counts())
        self.status.gauges.update(self.kafka.gauges())
        self.status.gauges.update(inflight=self.dispatch.running, queued=len(self.sched),
                                  parked=self.parked.total(), seen_keys=len(self.seen),
                                  paused=int(self.dispatch.paused))
        if self.dispatch.running or len(self.sched):
            self.status.add("busy_ticks")
        self.status.write()
