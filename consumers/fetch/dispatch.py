"""A fetch worker's dispatch: which queued job goes now, and one job's request.

Ready jobs are started within the worker's in-flight limit and the fleet-wide pace; a job
outside its target's crawl window waits, one known to be disallowed by robots.txt is
dead-lettered without spending the target's slot. Each job is placed on a profile and an
egress (:class:`consumers.fetch.identities.Identities`) as it goes; one with no eligible profile
or egress waits (its slot given back, never dropped) and is queued again when the control
state changes or every ``WAIT_RECHECK_S``. A target-scoped quarantine holds the target like
a pause. One job asks robots.txt first (through the cache, with its profile's User-Agent),
then makes its request as its identity; the answer becomes records (:class:`OutcomeRules`)
and a signal the target's policy reads (rests, slowdowns, shedding to disk) and its
identity's (the pair's cookie jar, the egress's health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from consumers.fetch.classify import Signal
from consumers.fetch.http import Fetcher, Identity
from consumers.fetch.intake import Intake
from consumers.fetch.outcomes import Result
from consumers.fetch.quarantine_holds import QUARANTINED
from consumers.fetch.robots import UNREACHABLE_RETRY_S
from consumers.fetch.sitemap_fetch import packed, robots_outputs
from consumers.fetch.targets import Targets
from consumers.fetch.wiring import FetchWiring
from consumers.sitemaps import fetch_cap
from core.errors import CrawlfleetError, RobotsDisallowedError
from schemas.topics import partition_for
from streams.control import ControlState
from streams.ledger import Pending

#: A dispatcher held for a commit looks again this often (a commit also wakes it).
COMMIT_WAIT_S = 0.5

log = logging.getLogger("crawlfleet.fetch")


class Dispatcher:
    """Starts fetches and runs each one. ``paused``: a person paused the fleet (finish
    what is in flight, start nothing); ``running``: requests in flight. What may go next
    and what a request's answer changes for its target are :class:`Targets`' to say."""

    fetcher: Fetcher

    def __init__(self, w: FetchWiring, targets: Targets, intake: Intake) -> None:
        self.s, self.topo, self.rules, self.ledger = w.s, w.topo, w.rules, w.ledger
        self.status, self.wake = w.status, w.wake
        self.targets, self.intake = targets, intake
        self.running = 0
        self.paused = False
        self.tasks: set[asyncio.Task[None]] = set()
        #: The job of each request task, so a revoke can abort those of moved partitions.
        self.jobs: dict[asyncio.Task[None], Pending] = {}
        #: Whether this worker stops (set by the stage: its stop flag).
        self.stopping: Callable[[], bool] = lambda: False
        #: Seconds the commit under way has taken (set by the stage: its session's).
        self.commit_age: Callable[[float], float] = lambda _now: 0.0
        #: Requests wait for a commit: ``max_uncommitted`` finished or in flight.
        self.held_for_commit = False

    async def dispatch_loop(self) -> None:
        targets = self.targets
        while True:
            now = time.monotonic()
            self.intake.refill_due(now)
            if targets.recheck_due(now):
                self.recheck(now)
            free = targets.pace(now, self.start_allowance())
            if free > 0:
                started = 0
                for target, pj in targets.ready(now, free):
                    if not self.ledger.current(pj.tp, pj.epoch):
                        self.ledger.release(pj)
                        targets.done(target, now)
                        continue  # partition moved away: the new owner redoes it
                    if self._outside_window(target, pj, now):
                        targets.done(target, now)
                        continue
                    if not self.place(target, pj, now) or self._disallowed_now(target, pj, now):
                        targets.done(target, now)
                        continue
                    self.running += 1
                    started += 1
                    task = asyncio.create_task(self.fetch(pj))
                    self.tasks.add(task)
                    self.jobs[task] = pj
                    task.add_done_callback(self._task_done)
                targets.started(now, started)
            due = targets.next_due()
            if free <= 0 and self.held_for_commit:
                due = now + COMMIT_WAIT_S if due is None else min(due, now + COMMIT_WAIT_S)
            timeout = None if due is None or self.running >= self.s.max_inflight \
                or self.paused or self.stopping() else max(0.0, due - time.monotonic())
            self.wake.clear()
            # asyncio.timeout, not wait_for: this runs once per finished request, and
            # wait_for wraps every wait in a new Task.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wake.wait()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.jobs.pop(task, None)

    async def abort_moved(self) -> int:
        """Cancel every request task of a partition that moved (its epoch is no longer
        current) and wait until each has ended; returns how many. Once a revoke returns,
        the new owner may send to those targets an interval after its restore: a task of
        ours still waiting for its send slot (or for robots.txt) would otherwise send too,
        two workers on one target at once. Its result would be dropped anyway (the next
        owner redoes the job), so aborting loses nothing."""
        moved = [t for t, pj in self.jobs.items() if not self.ledger.current(pj.tp, pj.epoch)]
        for task in moved:
            task.cancel()
        if moved:
            await asyncio.gather(*moved, return_exceptions=True)
        return len(moved)

    def start_allowance(self) -> int:
        """Requests that may start now. None while the fleet is paused or this worker stops
        (what is in flight finishes; a graceful stop must not keep fetching while its final
        commit waits on a slow broker), and none while the results finished but not yet
        committed, plus those in flight, reach ``max_uncommitted``: a commit that stalls
        must not let the work a kill would make the next owner repeat grow without bound.
        A commit under way for longer than ``commit_stall_s`` holds them too: its broker is
        slow or gone (librdkafka#5456/#5511 leave a call hanging for minutes), and what is
        fetched meanwhile is likely to be fetched again."""
        if self.paused or self.stopping():
            return 0
        room = self.s.max_uncommitted - self.running - self.ledger.uncommitted
        held = room <= 0 or self.commit_age(time.monotonic()) > self.s.commit_stall_s
        if held and not self.held_for_commit:
            self.status.add("held_for_commit")
        self.held_for_commit = held
        return 0 if held else min(self.s.max_inflight - self.running, room)

    def _moved(self, pj: Pending) -> bool:
        """Whether ``pj``'s partition moved while it waited for its send slot: it must not
        send (its target is the new owner's now; :meth:`abort_moved` cancels it too)."""
        return not self.ledger.current(pj.tp, pj.epoch)

    def _disallowed_now(self, target: str, pj: Pending, now: float) -> bool:
        """Known robots-disallowed: dead-letter it without spending the target's slot."""
        rules = self.targets.known_rules(pj.job["url"])
        if rules is None:
            return False
        if rules.allows(pj.job["url"], self.targets.token(pj)):
            pj.allowed_by = rules  # _fetch need not ask protego again
            return False
        self.targets.refund(target, now)
        res = self.rules.dead(pj, "robots_disallowed", f"robots.txt disallows {pj.job['url']}",
                              0, now)
        self.status.metrics.dead_letter(res.reason)
        self.intake.finish(pj, res.outputs, res.seen)
        self.intake.refill(target)
        return True

    def place(self, target: str, pj: Pending, now: float) -> bool:
        """Place ``pj`` on a profile and an egress (``pj.profile``, ``pj.egress``); False
        when it cannot go now: it waits for an eligible one (its slot given back), or it
        was dead-lettered (a pinned profile this worker does not know)."""
        job = pj.job
        if job.get("pinned", True) and not self.targets.knows_profile(job["profile"]):
            self.targets.refund(target, now)
            res = self.rules.dead(pj, "unknown_profile", f"profile {job['profile']!r} is "
                                  "not configured on this worker", 0, now)
            self.status.metrics.dead_letter(res.reason)
            self.intake.finish(pj, res.outputs, res.seen)
            return False
        return self.targets.place(target, pj, now)

    def identity(self, pj: Pending) -> Identity:
        return self.targets.identity(pj)

    def _outside_window(self, target: str, pj: Pending, now: float) -> bool:
        """Outside the target's crawl window the job waits (queued or parked), never dropped."""
        wait = self.targets.window_wait(target)
        if wait <= 0:
            return False
        self.targets.requeue(target, pj, now)
        self.status.add("outside_window")
        self.defer(target, wait, now)
        return True

    async def fetch(self, pj: Pending) -> None:
        job, target, targets = pj.job, pj.target, self.targets
        started = time.monotonic()
        result: Result | None = None
        answered = -1  # no page request sent; 0: sent, no answer; else the answer's status
        try:
            identity = targets.identity(pj)
            if not targets.robots_fresh(job["url"]):
                await targets.spaced(target)  # robots.txt may be asked now: the slot's request
                if self._moved(pj):
                    return
            rules = await targets.rules_for(job["url"], target, identity)
            if rules is None:  # this slot was spent on robots.txt: go again later
                # The site has seen this identity now: after a block it stays eligible, so
                # the profile that asked for robots.txt can carry the target's work.
                targets.sent_as(target, pj.profile)
                now = time.monotonic()
                targets.requeue(target, pj, now)
                # A full interval after the answer, not after the release: the robots.txt
                # request may have left late (a burst of new targets), and the site counts
                # the gap between the requests it saw.
                targets.after_robots(target, now)
                return
            if rules.unreachable:
                result = self.rules.retry_or_dead(pj, "robots_unreachable",
                                                  UNREACHABLE_RETRY_S, 0, started)
                if targets.has_work(target):
                    # Its other jobs wait out the retry time. A target with none left
                    # rests no slot: its cached rules answer a next job until then, so
                    # it can be forgotten like any idle target (a minted host, say).
                    self.defer(target, UNREACHABLE_RETRY_S, time.monotonic())
            elif rules is not pj.allowed_by and not rules.allows(job["url"], targets.token(pj)):
                raise RobotsDisallowedError(f"robots.txt disallows {job['url']}")
            else:
                answered = 0
                targets.sent_as(target, pj.profile)
                await targets.spaced(target)
                if self._moved(pj):
                    return
                # a revisit asks "changed since?" with what its last visit answered
                resp = await self.fetcher.get(
                    job["url"], fetch_cap(job, self.s), identity=identity,
                    conditional=job.get("validators") if job.get("visit", 0) else None)
                answered = resp.status
                result = self.rules.response(pj, packed(job, resp), started)
        except CrawlfleetError as exc:
            result = self.rules.error(pj, exc, started)
        except Exception as exc:  # a bug must not leave the job unfinished, pinning offsets
            log.exception("fetch of %s failed unexpectedly", job["url"])
            result = self.rules.dead(pj, "internal", f"{type(exc).__name__}: {exc}", 0,
                                     started)
        finally:
            self.running -= 1
            targets.done(target, time.monotonic())
            self.wake.set()
        if result is None:
            return
        self.observe(target, result, job["url"])
        if answered >= 0 and pj.profile:
            targets.observe_identity(target, pj, result.signal, time.monotonic(),
                                     result.reason)
        if answered >= 0:
            self.status.metrics.request(result.outcome, answered, time.monotonic() - started)
        if result.outputs and result.outputs[0].topic == self.topo.fetched:
            self.status.add("fetched")
        elif result.seen[0] == "RETRYING":
            self.status.add("retries")
        else:
            self.status.add("dead")
            self.status.metrics.dead_letter(result.reason)
        owed = targets.take_sitemaps(job["url"])  # robots.txt's Sitemap: lines, once
        if owed:
            result.outputs += robots_outputs(self.rules.enc, self.topo, job, pj.profile,
                                             owed, self.s)
        self.intake.finish(pj, result.outputs, result.seen)
        self.intake.refill(target)

    def observe(self, target: str, result: Result, url: str | None = None) -> None:
        """Tell the target's owner a request's signal (of ``url``); do the rest and
        shedding it asks."""
        now = time.monotonic()
        seen = self.targets.observe(target, result.signal, result.retry_after_s, now, url)
        if result.signal not in (Signal.OK, Signal.NEUTRAL):
            self.status.add(f"signal_{result.signal.value}")
        if seen.shed_to is not None:
            self.intake.shed(target, seen.shed_to)
        if seen.wait > 0:
            self.defer(target, seen.wait, now)

    def defer(self, target: str, wait: float, now: float) -> None:
        """No request to ``target`` for ``wait`` s; a long rest sends its queue to disk."""
        if self.targets.defer(target, wait, now):
            self.intake.shed(target, 0)

    def keep_only(self, owned: set[int]) -> None:
        """The worker owns only ``owned`` partitions now: the identity state (cookie jars,
        used profiles, waiting jobs) of every other target goes, then its queued jobs."""
        parts = self.topo.partitions
        for pj in self.targets.keep_only(lambda t: partition_for(t, parts) in owned):
            self.ledger.release(pj)
        self.drop_stale()

    def drop_stale(self) -> None:
        """Forget queued jobs of partitions this worker no longer owns."""
        def keep(pj: Pending) -> bool:
            if self.ledger.current(pj.tp, pj.epoch):
                return True
            self.ledger.release(pj)
            return False
        self.targets.drop(keep)
        self.ledger.drop_holders(self.ledger.current)
        self.wake.set()

    def apply_control(self, state: ControlState) -> None:
        """Loop thread: the targets take the control state (quarantines, holds, intervals
        of every target) and every waiting job gets another chance."""
        self.recheck(time.monotonic(), self.targets.apply_control(state))

    def end_held(self, now: float) -> None:
        """A one-off crawl's drain: every job a quarantine holds ends as a dead letter
        ``quarantined`` naming the quarantine and its end (quarantine_holds)."""
        refill = set()
        for pj in self.targets.take_held():
            if not self.ledger.current(pj.tp, pj.epoch):
                self.ledger.release(pj)
                continue
            res = self.rules.dead(pj, QUARANTINED, self.targets.hold_text(pj), 0, now)
            self.status.metrics.dead_letter(res.reason)
            self.status.add("quarantine_ended")
            self.intake.finish(pj, res.outputs, res.seen)
            refill.add(pj.target)
        for target in refill:
            self.intake.refill(target)

    def recheck(self, now: float, targets: list[str] | None = None) -> None:
        """Holds from the control state for ``targets`` (None: the ones a target
        quarantine holds or held), and waiting jobs queued again in order: each is placed
        anew at dispatch."""
        self.targets.recheck_holds(now, targets)
        if self.targets.ending_held():
            self.end_held(now)
        for target, jobs in self.targets.take_waiting().items():
            for pj in reversed(jobs):
                if self.ledger.current(pj.tp, pj.epoch):
                    self.targets.requeue(target, pj, now)
                else:
                    self.ledger.release(pj)
        self.wake.set()
