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
from datetime import UTC, datetime

from consumers.fetch.classify import Signal
from consumers.fetch.http import Fetcher, Identity
from consumers.fetch.identities import WAIT_RECHECK_S, Identities
from consumers.fetch.intake import Intake
from consumers.fetch.outcomes import OutcomeRules, Result
from consumers.fetch.pacer import Pacer
from consumers.fetch.parking import ParkedQueues
from consumers.fetch.robots import UNREACHABLE_RETRY_S
from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import TargetScheduler
from consumers.fetch.target_policy import TargetPolicy
from core.config import Settings
from core.errors import CrawlfleetError, RobotsDisallowedError
from core.profiles import EGRESS_META, unknown_profile
from schemas.topics import Topology, partition_for
from streams.control import ControlState
from streams.ledger import Ledger, Pending
from streams.status import StatusFile

#: A dispatcher held for a commit looks again this often (a commit also wakes it).
COMMIT_WAIT_S = 0.5

log = logging.getLogger("crawlfleet.fetch")


class Dispatcher:
    """Starts fetches and runs each one. ``paused``: a person paused the fleet (finish
    what is in flight, start nothing); ``running``: requests in flight."""

    fetcher: Fetcher

    def __init__(self, s: Settings, topo: Topology, sched: TargetScheduler[Pending],
                 policy: TargetPolicy, robots: RobotsCache, rules: OutcomeRules,
                 ledger: Ledger, parked: ParkedQueues, intake: Intake, pacer: Pacer,
                 status: StatusFile, wake: asyncio.Event) -> None:
        self.s, self.topo, self.sched, self.policy = s, topo, sched, policy
        self.robots, self.rules, self.ledger, self.parked = robots, rules, ledger, parked
        self.intake, self.pacer, self.status, self.wake = intake, pacer, status, wake
        self.running = 0
        self.paused = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.ids: Identities = policy.identities
        self.control: ControlState | None = None  # the last control state applied
        self.recheck_at = 0.0  # when waiting jobs and quarantine holds are looked at again
        #: Targets held by a target-scoped quarantine, and why (shown in the status file).
        self.quarantined: dict[str, str] = {}
        #: Whether this worker stops (set by the stage: its stop flag).
        self.stopping: Callable[[], bool] = lambda: False
        #: Seconds the commit under way has taken (set by the stage: its session's).
        self.commit_age: Callable[[float], float] = lambda _now: 0.0
        #: Requests wait for a commit: ``max_uncommitted`` finished or in flight.
        self.held_for_commit = False

    async def dispatch_loop(self) -> None:
        while True:
            now = time.monotonic()
            self.intake.refill_due(now)
            if now >= self.recheck_at:
                self.recheck(now)
            free = self.start_allowance()
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
                    if not self.place(target, pj, now) or self._disallowed_now(target, pj, now):
                        self.sched.done(target, now)
                        continue
                    self.running += 1
                    started += 1
                    task = asyncio.create_task(self.fetch(pj))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                self.pacer.take(now, started)
            due, wake = self.sched.next_due(), self.policy.next_wake()
            if wake is not None:
                due = wake if due is None else min(due, wake)
            if self.ids.waiting_total() or self.quarantined:
                due = self.recheck_at if due is None else min(due, self.recheck_at)
            paced = self.pacer.next_at()
            if due is not None and paced is not None:
                due = max(due, paced)
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

    async def spaced(self, target: str) -> None:
        """Wait until a request to ``target`` may leave (an interval after the last one
        did), then count it as left."""
        now = time.monotonic()
        delay = self.sched.reserve_send(target, now) - now
        if delay > 0:
            self.status.add("send_spacing_waits")
            await asyncio.sleep(delay)
        self.sched.sent(target, time.monotonic())  # left later than reserved: the next waits

    def _disallowed_now(self, target: str, pj: Pending, now: float) -> bool:
        """Known robots-disallowed: dead-letter it without spending the target's slot."""
        rules = self.robots.known(pj.job["url"])
        if rules is None or rules.unreachable:
            return False
        if rules.allows(pj.job["url"], self.token(pj)):
            pj.allowed_by = rules  # _fetch need not ask protego again
            return False
        self.sched.refund(target, now)
        res = self.rules.dead(pj, "robots_disallowed", f"robots.txt disallows {pj.job['url']}",
                              0, now)
        self.status.metrics.dead_letter(res.reason)
        self.intake.finish(pj, res.outputs, res.seen)
        self.intake.refill(target)
        return True

    def token(self, pj: Pending) -> str:
        """The robots.txt token the job's rules are matched with: its placed profile's."""
        profile = self.ids.profiles.get(pj.profile)
        return profile.robots_token if profile is not None else self.s.robots_agent

    def place(self, target: str, pj: Pending, now: float) -> bool:
        """Place ``pj`` on a profile and an egress (``pj.profile``, ``pj.egress``); False
        when it cannot go now: it waits for an eligible one (its slot given back), or it
        was dead-lettered (a pinned profile this worker does not know)."""
        job = pj.job
        now_ms = int(time.time() * 1000)
        pinned = bool(job.get("pinned", True))  # a job from before "pinned" was pinned
        if pinned and job["profile"] not in self.ids.profiles:
            self.sched.refund(target, now)
            res = self.rules.dead(pj, "unknown_profile", f"profile {job['profile']!r} is "
                                  "not configured on this worker", 0, now)
            self.status.metrics.dead_letter(res.reason)
            self.intake.finish(pj, res.outputs, res.seen)
            return False
        profile = self.ids.place(target, job["profile"], pinned, now_ms)
        egress = None if profile is None else self.ids.choose_egress(
            target, profile, (job.get("meta") or {}).get(EGRESS_META), job.get("last_error"),
            now, now_ms)
        if profile is None or egress is None:
            self.sched.refund(target, now)
            self.ids.wait(target, pj)
            self.status.add("identity_waits")
            return False
        pj.profile, pj.egress = profile, egress
        return True

    def identity(self, pj: Pending) -> Identity:
        """What ``pj``'s request is sent as: its profile's headers, its (target, profile)
        cookie jar, its egress's proxy. A job started without placement (a test's) goes as
        its own profile directly; a pinned one whose profile is unknown here is never sent
        as another identity (intake dead-letters those first: this is the last guard)."""
        if pj.profile not in self.ids.profiles:
            own = pj.job["profile"]
            refused = unknown_profile(own, self.ids.profiles)
            if refused is not None and pj.job.get("pinned", True):
                raise refused
            pj.profile = own if refused is None else self.s.default_profile
        profile = self.ids.profiles[pj.profile]
        egress = self.ids.egress.get(pj.egress)
        return Identity(profile.request_headers(), self.ids.jar(pj.target, pj.profile),
                        egress.proxy if egress is not None and egress.proxy else None)

    def _outside_window(self, target: str, pj: Pending, now: float) -> bool:
        """Outside the target's crawl window the job waits (queued or parked), never dropped."""
        wait = self.policy.window_wait(target, datetime.now(UTC))
        if wait <= 0:
            return False
        self.sched.push_front(target, pj, now, tier=pj.tier)
        self.status.add("outside_window")
        self.defer(target, wait, now)
        return True

    async def fetch(self, pj: Pending) -> None:
        job, target = pj.job, pj.target
        started = time.monotonic()
        result: Result | None = None
        answered = -1  # no page request sent; 0: sent, no answer; else the answer's status
        try:
            identity = self.identity(pj)
            if not self.robots.fresh(job["url"]):
                await self.spaced(target)  # robots.txt may be asked now: the slot's request
            rules = await self.robots.rules_for(job["url"], target, identity)
            if rules is None:  # this slot was spent on robots.txt: go again later
                # The site has seen this identity now: after a block it stays eligible, so
                # the profile that asked for robots.txt can carry the target's work.
                self.ids.sent(target, pj.profile)
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
                    self.defer(target, UNREACHABLE_RETRY_S, time.monotonic())
            elif rules is not pj.allowed_by and not rules.allows(job["url"], self.token(pj)):
                raise RobotsDisallowedError(f"robots.txt disallows {job['url']}")
            else:
                answered = 0
                self.ids.sent(target, pj.profile)
                await self.spaced(target)
                resp = await self.fetcher.get(job["url"], identity=identity)
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
        self.observe(target, result)
        if answered >= 0 and pj.profile:
            self.ids.observe(target, pj.profile, pj.egress, result.signal, time.monotonic())
        if answered >= 0:
            self.status.metrics.request(result.outcome, answered, time.monotonic() - started)
        if result.outputs and result.outputs[0].topic == self.topo.fetched:
            self.status.add("fetched")
        elif result.seen[0] == "RETRYING":
            self.status.add("retries")
        else:
            self.status.add("dead")
            self.status.metrics.dead_letter(result.reason)
        self.intake.finish(pj, result.outputs, result.seen)
        self.intake.refill(target)

    def observe(self, target: str, result: Result) -> None:
        """Feed a request's signal to the target's policy; do the rest and shedding it asks."""
        now = time.monotonic()
        seen = self.policy.observe(target, result.signal, result.retry_after_s, now)
        if result.signal not in (Signal.OK, Signal.NEUTRAL):
            self.status.add(f"signal_{result.signal.value}")
        if seen.shed_to is not None:
            self.intake.shed(target, seen.shed_to)
        if seen.wait > 0:
            self.defer(target, seen.wait, now)

    def defer(self, target: str, wait: float, now: float) -> None:
        """No request to ``target`` for ``wait`` s; a long rest sends its queue to disk."""
        self.status.add("deferrals")
        if self.policy.defer(target, wait, now):
            self.intake.shed(target, 0)

    def keep_only(self, owned: set[int]) -> None:
        """The worker owns only ``owned`` partitions now: the identity state (cookie jars,
        used profiles, waiting jobs) of every other target goes, then its queued jobs."""
        parts = self.topo.partitions
        for pj in self.ids.keep_only(lambda t: partition_for(t, parts) in owned):
            self.ledger.release(pj)
        self.drop_stale()

    def drop_stale(self) -> None:
        """Forget queued jobs of partitions this worker no longer owns."""
        def keep(pj: Pending) -> bool:
            if self.ledger.current(pj.tp, pj.epoch):
                return True
            self.ledger.release(pj)
            return False
        self.sched.drop(keep)
        self.ledger.drop_holders(self.ledger.current)
        self.wake.set()

    def held_by_control(self, target: str) -> bool:
        """Whether ``target`` is held: paused by a person, or quarantined as a whole."""
        state = self.control
        return (state is not None and state.target_paused(target)) or \
            self.ids.target_quarantine(target, int(time.time() * 1000)) is not None

    def apply_control(self, state: ControlState) -> None:
        """Loop thread: re-derive target holds and intervals from the control state, apply
        its quarantines to the identities and give every waiting job another chance."""
        self.control = state
        self.ids.apply_quarantines(state.quarantines.values(), int(time.time() * 1000))
        self.recheck(time.monotonic(), self.sched.targets())

    def recheck(self, now: float, targets: list[str] | None = None) -> None:
        """Holds from the control state for ``targets`` (None: the ones a target
        quarantine holds or held, which end on their own), and waiting jobs queued again
        in order: each is placed anew at dispatch."""
        self.recheck_at = now + WAIT_RECHECK_S
        now_ms = int(time.time() * 1000)
        if targets is None:
            targets = [t for t in {*self.quarantined, *self.ids.quarantined_targets(now_ms)}
                       if t in self.sched]
        quarantined = {t: r for t, r in self.quarantined.items() if t not in targets}
        for target in targets:
            q = self.ids.target_quarantine(target, now_ms)
            if q is not None:
                quarantined[target] = q.reason or "quarantined"
                if target not in self.quarantined:
                    log.warning("target %s held by a quarantine: %s", target,
                                quarantined[target])
            if q is not None or (self.control is not None
                                 and self.control.target_paused(target)):
                self.sched.hold(target)
            else:
                self.sched.release(target, now)
            self.sched.set_interval(target, self.policy.interval(target))
        self.quarantined = quarantined
        self.status.gauges["quarantined_targets"] = len(quarantined)
        self.status.notes["quarantined_targets"] = dict(quarantined)
        for target, jobs in (self.ids.take_waiting() if self.ids.waiting_total() else {}).items():
            for pj in reversed(jobs):
                if self.ledger.current(pj.tp, pj.epoch):
                    self.sched.push_front(target, pj, now, tier=pj.tier)
                else:
                    self.ledger.release(pj)
        self.wake.set()
