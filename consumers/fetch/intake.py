"""A fetch worker's intake: what comes in from the frontier, goes to disk and comes back.

Each frontier record is admitted (decoded, its URL canonicalised, its profile looked up in
this worker's configuration, its scope and target checked again, its dedupe key looked up)
and then held in memory within its target's share, or parked on disk
(:class:`ParkedQueues`) to come back with a refill when the target has room. Every finished
job's outputs, dedupe state and parked-queue change go to the :class:`Ledger`, which
commits them with the input offsets. No Kafka call is made here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, Message

from consumers.fetch.parking import ParkedQueues, park_key
from consumers.fetch.scheduler import QUEUES, queue_of
from consumers.fetch.seen import SeenStore
from consumers.fetch.targets import Targets
from consumers.fetch.visit_prune import MAX_WALK, prunable_visits
from consumers.fetch.wiring import FetchWiring
from consumers.scope import OUT_OF_SCOPE, REROUTE, recheck
from core.errors import DecodeError, InvalidURLError
from core.profiles import unknown_profile
from core.urls import canonicalize, target_of
from schemas.keys import REPLAY_META, job_dedupe_key, visit_key
from schemas.lineage import DUPLICATE, PARKED, lineage_event
from schemas.records import CrawlJob
from schemas.topics import partition_for
from streams.control import backlog_key
from streams.io import Output, offset_of, tp_of
from streams.ledger import Pending, StoreChange

log = logging.getLogger("crawlfleet.fetch")
TP = tuple[str, int]
#: Targets with parked work and nothing in memory are looked for this often: a refill is
#: otherwise triggered by the target's own events (a job finishing, a commit, a restore,
#: the end of a rest), and a target with none left must not strand its parked queue.
REFILL_SWEEP_S = 5.0


class Intake:
    """Admits frontier records, parks and refills per-target work, finishes jobs."""

    def __init__(self, w: FetchWiring, targets: Targets, seen: SeenStore,
                 parked: ParkedQueues) -> None:
        self.s, self.topo, self.enc, self.ledger = w.s, w.topo, w.enc, w.ledger
        self.rules, self.status, self.wake = w.rules, w.status, w.wake
        self.targets, self.seen, self.parked = targets, seen, parked
        self._allowed = frozenset(w.s.allowed_targets)
        self._profiles = w.s.profile_table
        # write times are whole seconds, rounded down: a key may be up to 1 s younger
        self._horizon_s = w.s.dedupe_horizon_s + 1.0
        self.refill_sweep_at = time.monotonic() + REFILL_SWEEP_S

    def admit(self, msgs: list[Message]) -> None:
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
                self.finish_raw(tp, offset, epoch, [self.enc.undecodable(msg, exc)])
                continue
            except InvalidURLError as exc:
                self.status.metrics.dead_letter(exc.reason)
                self.finish_raw(tp, offset, epoch, [
                    self.enc.dead(job, None, tp[0], exc.reason, str(exc), job["attempt"])])
                continue
            if self.unknown_profile(tp, offset, epoch, job):
                continue
            verdict = recheck(job, scope=self.s.scope, target_mode=self.s.target_mode,
                              allowed=self._allowed)
            if verdict is not None:
                self.misplaced(tp, offset, epoch, job, verdict)
                continue
            pj = Pending(tp, offset, epoch, job, job_dedupe_key(job))
            if self.ledger.is_duplicate(pj, self.seen.get):
                self.status.add("skipped_seen")
                self.ledger.finish(pj, [self.duplicate(pj)], None)
                continue
            target, queue = pj.target, self.queue_of(pj)
            if self.targets.must_park(target, queue, now):
                self.park(pj)  # it comes back with a refill
                continue
            self.ledger.hold(pj)
            self.targets.queue(target, pj, now)
        self.wake.set()

    def tier_of(self, tp: TP) -> int:
        return 1 if tp[0] == self.topo.frontier_high else 0

    def queue_of(self, pj: Pending) -> int:
        """The job's queue number: its topic's tier, and whether it is a revisit."""
        return queue_of(self.tier_of(pj.tp), pj.revisit)

    def park(self, pj: Pending) -> None:
        """Send a job to disk: a frontier record is written to the parked changelog with
        its offset's commit; one taken from disk just goes back (its entry is still there)."""
        if pj.park_key is not None:
            self.ledger.release(pj)
            self.parked.untake(pj.park_key)
            return
        self.ledger.release(pj)  # before it gets its park key: that changes its identity
        if not self.ledger.current(pj.tp, pj.epoch):
            return
        pj.park_key = park_key(pj.target, self.queue_of(pj), pj.offset)
        change = self.parked.park(pj.tp[1], pj.park_key, pj.job)
        parked = [self.rules.park(pj), lineage_event(self.enc, pj.job, PARKED, "fetch")]
        if not self.ledger.finish(pj, parked, None, [change]):
            self.parked.aborted([change])
        self.status.add("parked")

    def duplicate(self, pj: Pending) -> Output:
        """The lineage event of a job suppressed by its dedupe key (with the state it met)."""
        state = self.seen.get(pj.tp[1], pj.key)
        return lineage_event(self.enc, pj.job, DUPLICATE, "fetch",
                             state[0].lower() if state else "in flight")

    def shed(self, target: str, keep: int) -> None:
        """Move ``target``'s queued jobs beyond its first ``keep`` to disk."""
        for pj in self.targets.take_tail(target, keep):
            self.park(pj)

    def home_tp(self, partition: int) -> TP | None:
        for topic in (self.topo.frontier, self.topo.frontier_high):
            if self.ledger.owns((topic, partition)):
                return topic, partition
        return None

    def refill_many(self, targets: Iterable[str]) -> None:
        for t in targets:
            self.refill(t)
        self.wake.set()

    def refill(self, target: str) -> None:
        """Bring ``target``'s oldest parked jobs back while it has room in its share."""
        if self.parked.available(target) <= 0:
            return
        now = time.monotonic()
        if self.targets.resting(target, now):
            return  # resting: due_wakes brings it back
        if not self.targets.room_for(target, now):
            return  # the refill sweep tries again
        part = partition_for(target, self.topo.partitions)
        tp = self.home_tp(part)
        epoch = self.ledger.epoch_of(tp) if tp is not None else None
        if tp is None or epoch is None:
            return
        share = self.targets.share(target)
        for queue in QUEUES:
            held = self.targets.held(target, queue)
            room = share - held
            if room <= 0 or (held and room < share // 2):
                continue  # refill in batches, not one scan per finished job
            for key, job in self.parked.take(part, target, queue, room):
                pj = Pending(tp, -1, epoch, job, job_dedupe_key(job), park_key=key)
                exc = unknown_profile(job["profile"], self._profiles)
                if exc is not None:  # parked by a worker configured otherwise
                    self.status.metrics.dead_letter(exc.reason)
                    self.status.add("dead")
                    self.finish(pj, [self.enc.dead(job, None, tp[0], exc.reason, str(exc),
                                                   job["attempt"])], None)
                    continue
                if self.ledger.is_duplicate(pj, self.seen.get):
                    self.status.add("skipped_seen")
                    self.finish(pj, [self.duplicate(pj)], None)  # only its entry goes
                    continue
                self.ledger.hold(pj)
                self.targets.queue(target, pj, now)
                self.status.add("unparked")

    def refill_due(self, now: float) -> None:
        for target in self.targets.due_wakes(now):
            self.refill(target)

    def sweep_parked(self, now: float) -> None:
        """Refill targets that have parked work and nothing in memory (main loop)."""
        if now < self.refill_sweep_at:
            return
        self.refill_sweep_at = now + REFILL_SWEEP_S
        for target in self.parked.waiting_targets():
            if not any(self.targets.held(target, queue) for queue in QUEUES):
                self.status.add("refill_sweeps")
                self.refill(target)
                self.wake.set()

    def finish(self, pj: Pending, outputs: list[Any], seen: tuple[str, int] | None) -> None:
        changes: list[StoreChange] = []
        drops: list[str] = []
        if seen is not None:
            drops = self.earlier_visits(pj)
            outputs = [*outputs, self.rules.seen(pj, seen),
                       *(self.rules.unseen(pj, key) for key in drops)]
        if pj.park_key is not None:  # it leaves the parked queue with this transaction
            outputs = [*outputs, self.rules.unpark(pj)]
            changes.append((pj.tp[1], pj.park_key, None))
        if self.ledger.finish(pj, outputs, seen, changes, drops):
            if drops:
                self.status.add("seen_pruned", len(drops))
        elif pj.park_key is not None:
            self.parked.untake(pj.park_key)

    def earlier_visits(self, pj: Pending) -> list[str]:
        """The keys of the page's earlier visits a revisit's key replaces: those older than
        the dedupe horizon, never visit 0's (:mod:`consumers.fetch.visit_prune`); none for a
        replay (its key is not the page's chain)."""
        visit = int(pj.job.get("visit") or 0)
        if visit < 2 or (pj.job.get("meta") or {}).get(REPLAY_META):
            return []
        part = pj.tp[1]
        keys = {k: visit_key(pj.job, k) for k in range(max(1, visit - MAX_WALK), visit)}
        return [keys[k] for k in prunable_visits(
            visit, lambda k: self.seen.written(part, keys[k]), time.time(), self._horizon_s)]

    def unknown_profile(self, tp: TP, offset: int, epoch: int, job: CrawlJob) -> bool:
        """Dead-letter a job whose profile this worker does not know (``unknown_profile``),
        before any request or dedupe state: nobody here can send it as that identity."""
        exc = unknown_profile(job["profile"], self._profiles)
        if exc is None:
            return False
        self.status.metrics.dead_letter(exc.reason)
        self.finish_raw(tp, offset, epoch, [
            self.enc.dead(job, None, tp[0], exc.reason, str(exc), job["attempt"])])
        return True

    def misplaced(self, tp: TP, offset: int, epoch: int, job: CrawlJob,
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
        self.finish_raw(tp, offset, epoch, [self.enc.dead(
            job, None, tp[0], OUT_OF_SCOPE, f"{job['url']} is out of scope {self.s.scope!r} "
            f"of the page that led to it ({job.get('parent_url')})", job["attempt"])])

    def finish_raw(self, tp: TP, offset: int, epoch: int, outputs: list[Any]) -> None:
        if self.ledger.finish_raw(tp, offset, epoch, outputs):
            self.status.add("dead")

    def backlog_reports(self, worker: str) -> list[Output]:
        """The parked backlog of partitions whose count changed, for the frontier bound
        (``crawl.control``, compacted: the latest count per partition is what stays)."""
        return [self.enc.control(backlog_key(part), {
                    "kind": "backlog", "target": None, "value": float(count), "text": None,
                    "issued_by": worker} if count > 0 else None)
                for part, count in self.parked.backlog_changes().items()]
