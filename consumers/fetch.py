"""Fetch stage: frontier jobs → polite HTTP fetches → FetchResult, retry or dead letter.

One asyncio loop runs many fetches at once; one dedicated thread makes every Kafka call
(poll, rebalance callbacks, transactional commits), so callbacks and commits never
overlap. Jobs queue per target in a :class:`TargetScheduler` (rate cap, Crawl-delay,
Retry-After), so a deferred target never blocks its partition. Completed work, its dedupe
state and the safe input offsets commit together in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from consumers.classify import Verdict, classify_status
from consumers.control import ControlReader
from consumers.http_fetch import HTTP_LIB_VERSION, TLS_LIB_VERSION, Fetcher, Response
from consumers.offsets import OffsetTracker
from consumers.pacer import Pacer
from consumers.robots import UNREACHABLE_RETRY_S, RobotsRules, rules_from_response
from consumers.runtime import (
    Encoder,
    FencedError,
    Output,
    StatusFile,
    StopFlag,
    TxnCommitter,
    consume_ready,
    consumer_conf,
    offset_of,
    topology_of,
    tp_of,
    worker_name,
)
from consumers.scheduler import TargetScheduler
from consumers.seen import DEAD, DONE, RETRYING, SeenStore
from consumers.slow_start import SlowStart
from consumers.windows import parse_windows, seconds_until_open
from crawlfleet import __version__
from crawlfleet.config import Settings
from crawlfleet.errors import (
    CrawlfleetError,
    DecodeError,
    InvalidURLError,
    KafkaStageError,
    RobotsDisallowedError,
)
from crawlfleet.urls import canonicalize, dedupe_key, origin_of
from schemas.topics import RETRY_DELAYS_S

log = logging.getLogger("crawlfleet.fetch")
R = TypeVar("R")
TP = tuple[str, int]
FETCHER_VERSION = f"crawlfleet-fetch/{__version__}"
#: A target deferred at least this long has its queued jobs moved to a retry tier.
SPILL_AFTER_S = 10.0


@dataclass
class Pending:
    """A job between admission and completion, tagged with its partition's epoch."""

    tp: TP
    offset: int
    epoch: int
    job: dict[str, Any]
    key: str
    allowed_by: RobotsRules | None = None  # rules already checked at dispatch: allowed


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
                log.warning("fetch %s lost its transaction, rejoining: %s", self.worker, exc)
                self.status.add("fenced")
        self.status.remove()

    async def _session(self) -> None:
        await _Session(self).run()


# A worker out of queued jobs hands its results on this often, not on the full interval.
_STARVED_COMMIT_S = 0.1


class _Session:
    """One membership of the group: clients, in-memory state, all dropped together."""

    def __init__(self, stage: FetchStage) -> None:
        self.st = stage
        self.s = stage.s
        self.enc = stage.encoder
        self.status = stage.status
        self.lock = threading.Lock()
        self.kx = ThreadPoolExecutor(1, thread_name_prefix="kafka")
        self.sched: TargetScheduler[Pending] = TargetScheduler(self._base_interval)
        self.seen = SeenStore(self.s.data_dir / "seen" / (self.s.topic_prefix.rstrip(".")
                                                          or "default") / stage.worker)
        self.trackers: dict[TP, OffsetTracker] = {}
        self.epochs: dict[TP, int] = {}
        self.completed: list[Output] = []
        # Dedupe state not yet committed (pending) or being committed: it reaches the seen
        # store only after its transaction commits, so the store never holds aborted state.
        self.pending_seen: dict[tuple[int, str], tuple[str, int]] = {}
        self.committing_seen: dict[tuple[int, str], tuple[str, int]] = {}
        # Dedupe key -> (partition, epoch) of the job holding it. A holder from an older
        # epoch (its partition was revoked, maybe re-assigned) does not count: the
        # redelivered copy must run, or the job would be lost.
        self.inflight: dict[str, tuple[TP, int, int]] = {}
        self.robots: dict[str, RobotsRules] = {}
        self.robots_expiry: dict[str, float] = {}
        self.robots_pending: dict[str, asyncio.Future[RobotsRules]] = {}
        self.running = 0
        self.paused = False
        self.wake = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        self.consumer: Consumer | None = None
        self.broken: CrawlfleetError | None = None  # set by a rebalance callback
        self.control: ControlReader | None = None
        self.robots_interval: dict[str, float] = {}
        self.ctl_paused = False
        self.pacer = Pacer(self.s.fleet_rate_cap)
        self.members_stale = False
        self.admin: AdminClient | None = None
        self.windows = {t: parse_windows(w) for t, w in self.s.crawl_windows.items()}
        self.committer: TxnCommitter | None = None
        self.slow_start = SlowStart(floor=150)  # outputs (~3 per page) per transaction

    # --- Kafka thread -------------------------------------------------------------------

    async def _kafka(self, fn: Callable[..., R], *args: Any) -> R:
        return await self.loop.run_in_executor(self.kx, fn, *args)

    def _setup(self) -> None:
        group = self.st.topology.group("fetch")
        self.committer = TxnCommitter(self.s, f"{group}-{self.st.worker}", self.st.worker)
        self.control = ControlReader(self.s, self.st.topology.control, self.enc.codec)
        self.control.poll(1.0)  # settings in force before the first job is dequeued
        self.consumer = Consumer(consumer_conf(self.s, group, self.st.worker))
        self.consumer.subscribe([self.st.topology.frontier_high, self.st.topology.frontier],
                                on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = sorted({p.partition for p in partitions})
        n = self.seen.restore(self.s, self.st.topology.seen, parts, self.enc.codec)
        self.status.add("seen_restored", n)
        with self.lock:
            for p in partitions:
                tp = (p.topic, p.partition)
                self.trackers[tp] = OffsetTracker()
                self.epochs[tp] = self.epochs.get(tp, 0) + 1
        if self.paused or self.ctl_paused:  # pause state does not survive a rebalance
            consumer.pause(partitions)
        self.members_stale = self.s.fleet_rate_cap > 0  # read it outside the callback

    def _refresh_members(self) -> None:
        """Re-read the fetch group's live membership after a rebalance (fleet-wide cap)."""
        group = self.st.topology.group("fetch")
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
        with self.lock:  # work finishing from now on is the next owner's to redo
            for tp in revoked:
                self.epochs[tp] = self.epochs.get(tp, 0) + 1
        try:
            self._commit()  # hand over finished work before the partitions move
        except CrawlfleetError as exc:
            # Our state is no longer known to match the broker's: rebuild the session.
            self.broken = exc
        self._forget(revoked)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions already gone (session timed out): drop the work, commit nothing."""
        revoked = [(p.topic, p.partition) for p in partitions]
        with self.lock:
            for tp in revoked:
                self.epochs[tp] = self.epochs.get(tp, 0) + 1
        self.broken = FencedError("partitions lost: membership expired")
        self._forget(revoked)

    def _forget(self, revoked: list[TP]) -> None:
        with self.lock:
            for tp in revoked:
                self.trackers.pop(tp, None)
            owned = {tp[1] for tp in self.trackers}
        for part in self.seen.partitions() - owned:
            self.seen.drop(part)
        self.loop.call_soon_threadsafe(self._drop_stale)

    def _commit(self) -> None:
        assert self.consumer is not None and self.committer is not None
        positions = self.consumer.position(self.consumer.assignment())
        with self.lock:
            for pos in positions:
                tracker = self.trackers.get((pos.topic, pos.partition))
                if tracker is not None and pos.offset >= 0:
                    tracker.advance_to(pos.offset)
            outputs, self.completed = self.completed, []
            self.committing_seen, self.pending_seen = self.pending_seen, {}
            points = {tp: (t.safe_point() if outputs else t.commit_point())
                      for tp, t in self.trackers.items()}
        offsets = [TopicPartition(t, p, o) for (t, p), o in points.items() if o is not None]
        if not outputs and not offsets:
            return
        if outputs and not offsets:
            self.committing_seen = {}
            return  # we own nothing any more: these outputs are not ours to commit
        try:
            self.committer.commit(self.consumer, outputs, offsets)
        except CrawlfleetError:
            self.committing_seen = {}  # never committed: must not count as seen
            raise
        self.seen.put_many((p, k, st, a) for (p, k), (st, a) in self.committing_seen.items())
        with self.lock:
            self.committing_seen = {}
            for tp_ in offsets:
                tracker = self.trackers.get((tp_.topic, tp_.partition))
                if tracker is not None:
                    tracker.committed(tp_.offset)
        self.slow_start.committed(len(outputs))
        self.status.add("committed_txns")
        self.status.add("produced", len(outputs))

    def _poll(self, timeout: float) -> list[Message]:
        assert self.consumer is not None and self.control is not None
        changed = self.control.poll(0)
        if self.members_stale:
            self._refresh_members()
        buffered = len(self.sched) + self.running
        full = buffered >= self.s.max_buffered or (
            self.paused and buffered >= self.s.max_buffered // 2)
        want_paused = full or self.control.state.paused
        if want_paused != (self.paused or self.ctl_paused):
            if want_paused:
                self.consumer.pause(self.consumer.assignment())
            else:
                self.consumer.resume(self.consumer.assignment())
        self.paused, self.ctl_paused = full, self.control.state.paused
        if changed:
            self.loop.call_soon_threadsafe(self._apply_control)
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
            self.sched.set_interval(target, self._interval(target))
        self.wake.set()

    # --- event loop ---------------------------------------------------------------------

    async def run(self) -> None:
        await self._kafka(self._setup)
        try:
            async with Fetcher(self.s) as fetcher:
                self.fetcher = fetcher
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
            self.consumer.close()
        if self.committer is not None:
            self.committer.close()
        self.seen.close()
        if self.control is not None:
            self.control.close()

    async def _main_loop(self) -> None:
        last_commit = time.monotonic()
        while not self.st.stop.requested:
            # Jobs queued, in flight or finished but uncommitted: look again soon, so results
            # are committed (handed on) as soon as the last of them is done.
            busy = self.running or self.completed or len(self.sched)
            # Nothing queued: what is in flight or done is all this worker has, and its
            # results go out the moment they are complete (below), so do not oversleep it.
            handing_on = busy and not len(self.sched)
            msgs = await self._kafka(self._poll, 0.01 if handing_on else 0.05 if busy else 0.2)
            if self.broken is not None:
                raise self.broken
            if msgs:
                self._admit(msgs)
            now = time.monotonic()
            # Under load, commit on the interval (fewer, fuller transactions). With nothing
            # queued to start, the crawl is waiting on the links in our results: hand them
            # on every _STARVED_COMMIT_S, and at once when nothing is in flight either.
            starved = bool(self.completed) and not len(self.sched) and (
                not self.running or now - last_commit >= _STARVED_COMMIT_S)
            # After a quiet spell, results go out in growing transactions (slow start), so
            # a crawl's next level is found while this one is still being fetched.
            burst = len(self.completed) >= self.slow_start.cap(now)
            if now - last_commit >= self.s.commit_interval_s or starved or burst:
                await self._kafka(self._commit)
                last_commit = now
            self._report()

    def _report(self) -> None:
        self.status.gauges.update(inflight=self.running, queued=len(self.sched),
                                  seen_keys=len(self.seen), paused=int(self.paused))
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
            with self.lock:
                tracker = self.trackers.get(tp)
                if tracker is None:
                    continue  # revoked between fetch and delivery
                tracker.start(offset)
                epoch = self.epochs[tp]
            self.status.add("consumed")
            try:
                job = self.enc.decode("CrawlJob", msg)
                job["url"] = canonicalize(job["url"])
            except DecodeError as exc:
                self._finish_raw(tp, offset, epoch, [self.enc.undecodable(msg, exc)])
                continue
            except InvalidURLError as exc:
                self._finish_raw(tp, offset, epoch, [
                    self.enc.dead(job, None, tp[0], exc.reason, str(exc), job["attempt"])])
                continue
            pj = Pending(tp, offset, epoch, job, dedupe_key(job["profile"], job["url"]))
            if self._is_duplicate(pj):
                self.status.add("skipped_seen")
                self._finish(pj, [], None)
                continue
            self.inflight[pj.key] = (pj.tp, pj.epoch, pj.offset)
            self.sched.push(job["target"], pj, now, tier=job.get("priority", 0))
        self.wake.set()

    def _release(self, pj: Pending) -> None:
        """Only the job holding the key releases it (a skipped repeat must not)."""
        if self.inflight.get(pj.key) == (pj.tp, pj.epoch, pj.offset):
            del self.inflight[pj.key]

    def _is_duplicate(self, pj: Pending) -> bool:
        holder = self.inflight.get(pj.key)
        if holder is not None and self.epochs.get(holder[0]) == holder[1]:
            return True
        ref = (pj.tp[1], pj.key)
        state = self.pending_seen.get(ref) or self.committing_seen.get(ref) \
            or self.seen.get(pj.tp[1], pj.key)
        if state is None:
            return False
        return state[0] != RETRYING or state[1] != pj.job["attempt"]

    def _base_interval(self, target: str) -> float:
        """Interval for a target first seen: its cap, and hold it if it is paused."""
        if self.control is not None and self.control.state.target_paused(target):
            self.loop.call_soon(self.sched.hold, target)
        return self._interval(target)

    def _cap(self, target: str) -> float:
        live = self.control.state.caps.get(target) if self.control is not None else None
        return live or self.s.cap_for(target)

    def _interval(self, target: str) -> float:
        """The stricter of the cap and robots.txt's Crawl-delay / Request-rate."""
        return max(1.0 / self._cap(target), self.robots_interval.get(target, 0.0))

    async def _dispatch_loop(self) -> None:
        while True:
            now = time.monotonic()
            free = self.s.max_inflight - self.running
            if self.ctl_paused:
                free = 0  # a person paused the fleet: finish what is in flight, start nothing
            free = self.pacer.available(now, free)
            if free > 0:
                started = 0
                for target, pj in self.sched.pop_ready(now, free):
                    if self.epochs.get(pj.tp) != pj.epoch:
                        self._release(pj)
                        continue  # partition moved away: the new owner redoes it
                    if target in self.windows and self._outside_window(target, pj, now):
                        continue
                    if self._disallowed_now(target, pj, now):
                        continue
                    self.running += 1
                    started += 1
                    task = asyncio.create_task(self._fetch(pj))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                self.pacer.take(now, started)
            due = self.sched.next_due()
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
        rules = self.robots.get(origin_of(pj.job["url"]))
        if rules is None or rules.unreachable:
            return False
        if rules.allows(pj.job["url"], self.s.robots_agent):
            pj.allowed_by = rules  # _fetch need not ask protego again
            return False
        self.sched.refund(target, now)
        self._finish(pj, *self._dead(pj, "robots_disallowed",
                                     f"robots.txt disallows {pj.job['url']}", 0, now))
        return True

    def _outside_window(self, target: str, pj: Pending, now: float) -> bool:
        """Outside the target's crawl window the job waits (queued or spilled), never dropped."""
        wait = seconds_until_open(self.windows[target], datetime.now(UTC))
        if wait <= 0:
            return False
        self.sched.push_front(target, pj, now, tier=pj.job.get("priority", 0))
        self.sched.defer(target, now + min(wait, 3600.0))
        self.status.add("outside_window")
        if wait >= SPILL_AFTER_S:
            self._spill(target, min(wait, float(RETRY_DELAYS_S[-1])))
        return True

    def _drop_stale(self) -> None:
        """Forget queued jobs of partitions this worker no longer owns."""
        def keep(pj: Pending) -> bool:
            if self.epochs.get(pj.tp) == pj.epoch:
                return True
            self._release(pj)
            return False
        self.sched.drop(keep)

    # --- one job ------------------------------------------------------------------------

    async def _fetch(self, pj: Pending) -> None:
        job = pj.job
        outputs: list[Output] = []
        seen_state: tuple[str, int] | None = None
        started = time.monotonic()
        try:
            rules = await self._robots_for(job["url"], job["target"])
            if rules is None:  # this slot was spent on robots.txt: go again later
                self.sched.push_front(job["target"], pj, time.monotonic(),
                                      tier=job.get("priority", 0))
                return
            if rules.unreachable:
                self.sched.defer(job["target"], time.monotonic() + UNREACHABLE_RETRY_S)
                self._spill(job["target"], UNREACHABLE_RETRY_S)
                outputs, seen_state = self._retry_or_dead(pj, "robots_unreachable",
                                                          UNREACHABLE_RETRY_S, 0, started)
            elif rules is not pj.allowed_by and not rules.allows(job["url"],
                                                                  self.s.robots_agent):
                raise RobotsDisallowedError(f"robots.txt disallows {job['url']}")
            else:
                resp = await self.fetcher.get(job["url"])
                outputs, seen_state = self._on_response(pj, resp, started)
        except CrawlfleetError as exc:
            if exc.retryable:
                outputs, seen_state = self._retry_or_dead(pj, exc.reason, 0.0, 0, started,
                                                          str(exc))
            else:
                outputs, seen_state = self._dead(pj, exc.reason, str(exc), 0, started)
        finally:
            self.running -= 1
            self.wake.set()
        self._finish(pj, outputs, seen_state)

    def _on_response(self, pj: Pending, resp: Response,
                     started: float) -> tuple[list[Output], tuple[str, int]]:
        job = pj.job
        outcome = classify_status(resp.status, resp.retry_after, job["attempt"])
        if outcome.wait_s > 0 and (outcome.pushback or outcome.verdict is Verdict.RETRY):
            self.sched.defer(job["target"], time.monotonic() + outcome.wait_s)
            self.status.add("deferrals")
            if outcome.wait_s >= SPILL_AFTER_S:
                self._spill(job["target"], outcome.wait_s)
        if outcome.verdict is Verdict.STORE:
            result = self.enc.record(self.st.topology.fetched, "FetchResult", job["target"],
                                     pj.key.encode(), {
                "job": job, "final_url": resp.url, "status": resp.status,
                "content_type": resp.content_type, "body": resp.body,
                "fetched_at_ms": int(time.time() * 1000), "elapsed_ms": resp.elapsed_ms,
                "redirects": resp.redirects, "worker": self.st.worker})
            self.status.add("fetched")
            return [result, self._event(pj, resp.status, "ok", outcome.reason, started,
                                        len(resp.body))], (DONE, job["attempt"])
        if outcome.verdict is Verdict.RETRY:
            return self._retry_or_dead(pj, outcome.reason, outcome.wait_s, resp.status, started)
        return self._dead(pj, outcome.reason, f"HTTP {resp.status} from {resp.url}",
                          resp.status, started)

    def _retry_or_dead(self, pj: Pending, reason: str, wait_s: float, status: int,
                       started: float, error: str = "") -> tuple[list[Output], tuple[str, int]]:
        job = pj.job
        attempt = job["attempt"] + 1
        if attempt >= self.s.max_attempts:
            return self._dead(pj, reason, error or f"gave up after {attempt} attempts",
                              status, started)
        tier = self.st.topology.retry_tier_for(wait_s)
        again = {**job, "attempt": attempt, "last_error": reason,
                 "delay_ms": int(max(wait_s, tier) * 1000)}
        self.status.add("retries")
        return [self.enc.job(self.st.topology.retry(tier), again),
                self._event(pj, status, "retry", reason, started, 0)], (RETRYING, attempt)

    def _spill(self, target: str, wait_s: float) -> None:
        """Move a long-deferred target's queued jobs to a retry tier (attempts unchanged).

        Held in memory they would pin their partition's committed offset and fill the
        worker's buffer, which would pause partitions that other targets share.
        """
        tier = self.st.topology.retry_tier_for(wait_s)
        jobs = self.sched.take(target)
        for pj in jobs:
            if self.epochs.get(pj.tp) != pj.epoch:
                self._release(pj)
                continue
            again = {**pj.job, "delay_ms": int(max(wait_s, tier) * 1000)}
            self._finish(pj, [self.enc.job(self.st.topology.retry(tier), again)],
                         (RETRYING, pj.job["attempt"]))
        self.status.add("spilled", len(jobs))

    def _dead(self, pj: Pending, reason: str, error: str, status: int,
              started: float) -> tuple[list[Output], tuple[str, int]]:
        job = pj.job
        self.status.add("dead")
        return [self.enc.dead(job, None, pj.tp[0], reason, error, job["attempt"] + 1),
                self._event(pj, status, "dead", reason, started, 0)], (DEAD, job["attempt"])

    def _event(self, pj: Pending, status: int, outcome: str, reason: str, started: float,
               size: int) -> Output:
        job = pj.job
        return self.enc.record(self.st.topology.telemetry, "FetchEvent", job["target"],
                               pj.key.encode(), {
            "url": job["url"], "target": job["target"], "profile": job["profile"],
            "attempt": job["attempt"], "status": status, "outcome": outcome, "reason": reason,
            "elapsed_ms": int((time.monotonic() - started) * 1000), "bytes": size,
            "worker": self.st.worker, "fetcher_version": FETCHER_VERSION,
            "http_version": HTTP_LIB_VERSION, "tls_version": TLS_LIB_VERSION,
            "profile_bundle_version": self.s.profile_bundle_version,
            "code_revision": self.s.code_revision, "ts_ms": int(time.time() * 1000)})

    def _finish(self, pj: Pending, outputs: list[Output],
                seen_state: tuple[str, int] | None) -> None:
        self._release(pj)
        if seen_state is not None:
            state, attempt = seen_state
            outputs = [*outputs, self.enc.record(self.st.topology.seen, "Seen", pj.job["target"],
                                                 pj.key.encode(), {"state": state,
                                                                   "attempt": attempt,
                                                                   "status": 0})]
        with self.lock:
            if self.epochs.get(pj.tp) != pj.epoch:
                return  # partition moved while we worked: drop, the new owner redoes it
            if seen_state is not None:
                self.pending_seen[(pj.tp[1], pj.key)] = seen_state
            self.completed.extend(outputs)
            tracker = self.trackers.get(pj.tp)
            if tracker is not None:
                tracker.done(pj.offset)

    def _finish_raw(self, tp: TP, offset: int, epoch: int, outputs: list[Output]) -> None:
        with self.lock:
            if self.epochs.get(tp) != epoch:
                return
            self.completed.extend(outputs)
            tracker = self.trackers.get(tp)
            if tracker is not None:
                tracker.done(offset)
        self.status.add("dead")

    # --- robots.txt ---------------------------------------------------------------------

    async def _robots_for(self, url: str, target: str) -> RobotsRules | None:
        """Cached rules for the URL's origin; None means "fetched them just now, requeue"."""
        origin = origin_of(url)
        now = time.monotonic()
        rules = self.robots.get(origin)
        if rules is not None and self.robots_expiry.get(origin, 0) > now:
            return rules
        pending = self.robots_pending.get(origin)
        if pending is not None:
            await asyncio.shield(pending)
            return None
        fut: asyncio.Future[RobotsRules] = self.loop.create_future()
        self.robots_pending[origin] = fut
        try:
            rules = await self._fetch_robots(origin)
            self.robots[origin] = rules
            ttl = UNREACHABLE_RETRY_S if rules.unreachable else self.s.robots_ttl_s
            self.robots_expiry[origin] = time.monotonic() + ttl
            self.robots_interval[target] = max(self.robots_interval.get(target, 0.0),
                                               rules.min_interval_s)
            self.sched.set_interval(target, self._interval(target))
            fut.set_result(rules)
        finally:
            del self.robots_pending[origin]
            if not fut.done():
                fut.cancel()
        self.status.add("robots_fetched")
        return None

    async def _fetch_robots(self, origin: str) -> RobotsRules:
        try:
            resp = await self.fetcher.get(origin + "/robots.txt", max_bytes=512 * 1024)
        except (CrawlfleetError, aiohttp.ClientError):
            return rules_from_response(None, b"", self.s.robots_agent)
        return rules_from_response(resp.status, resp.body, self.s.robots_agent)
