"""A fetch worker's targets: the one object the fetch stage asks what may go next and
tells what happened.

Every piece of per-target state sits in a part this object owns, each with one concern:
the :class:`TargetScheduler` (queues, release times, in-flight limits, send spacing), the
:class:`TargetPolicy` (each target's slot: rate, adaptive health, rests, crawl windows,
memory share, forgetting idle targets), the :class:`RobotsCache`, the :class:`Identities`
(profiles, egress, cookie jars, quarantines) and the fleet-wide :class:`Pacer`. On top of
them it keeps what the control topic says of targets: live caps, paused targets and the
holds of target-scoped quarantines; and it reads the parked queues' order rule (new work
goes behind what a target has parked). Dispatch and intake never reach into those parts:
they ask (:meth:`ready`, :meth:`window_wait`, :meth:`known_rules`, :meth:`must_park`,
:meth:`next_due`) and tell (:meth:`done`, :meth:`refund`, :meth:`requeue`,
:meth:`observe`, :meth:`defer`, :meth:`apply_control`). No broker and no records here:
what a decision writes is the stage's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from consumers.fetch.classify import Signal
from consumers.fetch.http import Identity
from consumers.fetch.identities import WAIT_RECHECK_S
from consumers.fetch.pacer import Pacer
from consumers.fetch.parking import ParkedQueues
from consumers.fetch.quarantine_holds import describe, hold_of
from consumers.fetch.robots import RobotsRules
from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import QUEUES, TargetScheduler
from consumers.fetch.target_policy import Observed, TargetPolicy
from core.config import Settings
from core.profiles import EGRESS_META, unknown_profile
from core.urls import origin_of
from streams.control import ControlState, Quarantine
from streams.ledger import Pending
from streams.status import StatusFile

log = logging.getLogger("crawlfleet.fetch")


class Targets:
    """Per-target state of one fetch session, behind one set of questions and reports.

    ``taken_over_at(target)``: when this worker took the target's partition over from an
    owner that may have just sent to it (its first request waits an interval past that).
    ``latest()`` (set by the session) is the newest control state read from the broker:
    a target's live cap and whether it is paused are read from it when its slot is made.
    """

    def __init__(self, s: Settings, parked: ParkedQueues, status: StatusFile,
                 taken_over_at: Callable[[str], float]) -> None:
        self.s, self.parked, self.status = s, parked, status
        self.latest: Callable[[], ControlState | None] = lambda: None
        self.control: ControlState | None = None  # the last control state applied
        self.recheck_at = 0.0  # when waiting jobs and quarantine holds are looked at again
        #: Targets held by a target-scoped quarantine, and why (shown in the status file).
        self.quarantined: dict[str, str] = {}
        self.loop = asyncio.get_running_loop()
        self.sched: TargetScheduler[Pending] = TargetScheduler(
            self._base_interval, limit=s.max_inflight_per_target, taken_over_at=taken_over_at)
        profiles = s.profile_table.values()
        self.robots = RobotsCache(s.robots_agent, s.robots_ttl_s,
                                  lambda t, i: self.policy.on_robots(t, i),
                                  max_origins=s.max_target_state,
                                  tokens_for=lambda t: {p.robots_token for p in profiles
                                                        if p.allowed_for(t)})
        self.policy = TargetPolicy(s, self.sched, self.robots, self.cap, status.add)
        self.ids = self.policy.identities
        self.pacer = Pacer(s.fleet_rate_cap)
        #: robots.txt ``Sitemap:`` lines not yet carried by a job, by origin (bounded).
        self.follow_sitemaps = any(p.follow_sitemaps for p in profiles)
        self.sitemaps_owed: dict[str, tuple[str, ...]] = {}

    # --- live control: caps, paused targets, quarantine holds -------------------------------

    def cap(self, target: str) -> float:
        """``target``'s requests/s cap: the control topic's live one, else the settings'."""
        state = self.latest()
        live = state.caps.get(target) if state is not None else None
        return live or self.s.cap_for(target)

    def _base_interval(self, target: str) -> float:
        """Interval of a target given a slot (the policy's); held at once if it is paused
        or quarantined as a whole (after the slot is made: this runs while it is)."""
        state = self.latest()
        if (state is not None and state.target_paused(target)) \
                or self.held_by_control(target):
            self.loop.call_soon(self.sched.hold, target)
        return self.policy.base_interval(target)

    def held_by_control(self, target: str) -> bool:
        """Whether ``target`` is held: paused by a person, or quarantined as a whole."""
        state = self.control
        return (state is not None and state.target_paused(target)) or \
            self.ids.target_quarantine(target, int(time.time() * 1000)) is not None

    def apply_control(self, state: ControlState) -> list[str]:
        """A new control state: its quarantines go to the identities; returns the targets
        whose holds and intervals are to be derived again (every one with a slot)."""
        self.control = state
        self.ids.apply_quarantines(state.quarantines.values(), int(time.time() * 1000))
        return self.sched.targets()

    def recheck_due(self, now: float) -> bool:
        return now >= self.recheck_at

    def recheck_holds(self, now: float, targets: list[str] | None = None) -> None:
        """Holds from the control state for ``targets`` (None: the ones a target
        quarantine holds or held, which end on their own), and their intervals."""
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

    # --- what may go next -----------------------------------------------------------------

    def pace(self, now: float, free: int) -> int:
        """Of ``free`` requests this worker may start, those the fleet-wide pace allows."""
        return self.pacer.available(now, free)

    def ready(self, now: float, free: int) -> list[tuple[str, Pending]]:
        """Up to ``free`` jobs whose target may send now (interval, in-flight limit, holds)."""
        return self.sched.pop_ready(now, free)

    def started(self, now: float, n: int) -> None:
        self.pacer.take(now, n)

    def next_due(self) -> float | None:
        """When a job may next be ready: a target's release, the end of a long rest, a
        recheck of waiting jobs and quarantine holds; never before the fleet's pace."""
        due, wake = self.sched.next_due(), self.policy.next_wake()
        if wake is not None:
            due = wake if due is None else min(due, wake)
        if self.ids.waiting_total() or self.quarantined:
            due = self.recheck_at if due is None else min(due, self.recheck_at)
        paced = self.pacer.next_at()
        if due is not None and paced is not None:
            due = max(due, paced)
        return due

    def window_wait(self, target: str, at: datetime | None = None) -> float:
        """Seconds until ``target``'s crawl window opens (0: open, or it has none), read
        at ``at`` (default: now; the clock is read only for a target with windows)."""
        if target not in self.policy.windows:
            return 0.0
        return self.policy.window_wait(target, at or datetime.now(UTC))

    def known_rules(self, url: str) -> RobotsRules | None:
        """robots.txt rules for ``url``'s origin held now and reachable (None: not known)."""
        rules = self.robots.known(url)
        return None if rules is None or rules.unreachable else rules

    def robots_fresh(self, url: str) -> bool:
        return self.robots.fresh(url)

    async def rules_for(self, url: str, target: str,
                        identity: Identity) -> RobotsRules | None:
        """The rules (fetched as ``identity`` if not cached: then None, the slot was spent).
        A file fetched now leaves its ``Sitemap:`` lines for :meth:`take_sitemaps`."""
        fetched = self.robots.fetched
        rules = await self.robots.rules_for(url, target, identity)
        if self.follow_sitemaps and self.robots.fetched != fetched:
            known = self.robots.known(url)
            lines = tuple(known.parser.sitemaps) if known and known.parser else ()
            if lines:
                if len(self.sitemaps_owed) >= self.s.max_target_state:
                    self.sitemaps_owed.pop(next(iter(self.sitemaps_owed)))
                self.sitemaps_owed[origin_of(url)] = lines
        return rules

    def take_sitemaps(self, url: str) -> tuple[str, ...]:
        """The ``Sitemap:`` lines of ``url``'s origin's robots.txt fetched since a job of
        that origin last took them (once per fetch of the file; see ``sitemap_fetch``)."""
        return self.sitemaps_owed.pop(origin_of(url), ()) if self.sitemaps_owed else ()

    def has_work(self, target: str) -> bool:
        """Whether ``target`` has jobs queued here or parked (committed or not)."""
        return bool(self.sched.queued(target)) or any(
            self.parked.must_park(target, queue) for queue in QUEUES)

    def interval(self, target: str) -> float:
        return self.policy.interval(target)

    # --- identities -------------------------------------------------------------------------

    def knows_profile(self, profile: str) -> bool:
        return profile in self.ids.profiles

    def place(self, target: str, pj: Pending, now: float) -> bool:
        """Place ``pj`` on a profile and an egress (``pj.profile``, ``pj.egress``); False:
        none is eligible now, so it waits (its slot given back, never dropped)."""
        job = pj.job
        now_ms = int(time.time() * 1000)
        pinned = bool(job.get("pinned", True))  # a job from before "pinned" was pinned
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

    def token(self, pj: Pending) -> str:
        """The robots.txt token the job's rules are matched with: its placed profile's."""
        profile = self.ids.profiles.get(pj.profile)
        return profile.robots_token if profile is not None else self.s.robots_agent

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

    # --- what a quarantine holds (consumers/fetch/quarantine_holds.py) --------------------

    def held_by_quarantine(self) -> dict[str, int]:
        """Jobs held by a quarantine, per target: waiting for an identity none holds, or
        queued for a target quarantined as a whole. (Read at every status write: nothing
        waits and nothing is held, the usual case, costs no walk over the targets.)"""
        if not self.ids.waiting_total() and not self.quarantined:
            return {}
        held = {target: n for target in self.ids.targets
                if (n := self.ids.waiting(target))}
        for target in self.quarantined:
            held[target] = held.get(target, 0) + self.sched.queued(target)
        return held

    def quarantines(self) -> list[Quarantine]:
        return list(self.control.quarantines.values()) if self.control is not None else []

    def ending_held(self) -> bool:
        """A one-off crawl's drain asked for the held jobs to end (END_HELD)."""
        return self.control is not None and self.control.end_held

    def take_held(self) -> list[Pending]:
        """Every job a quarantine holds, removed: those waiting for an identity, and those
        queued for a target quarantined as a whole."""
        taken = [pj for jobs in self.take_waiting().values() for pj in jobs]
        held_targets = set(self.quarantined)
        if held_targets:
            def keep(pj: Pending) -> bool:
                if pj.target in held_targets:
                    taken.append(pj)
                    return False
                return True
            self.sched.drop(keep)
        return taken

    def hold_text(self, pj: Pending) -> str:
        q = hold_of(self.quarantines(), pj.target, pj.job["profile"], int(time.time() * 1000))
        return describe(q, pj.target)

    def take_waiting(self) -> dict[str, list[Pending]]:
        """Jobs that waited for an eligible identity, by target, to be placed again."""
        return self.ids.take_waiting() if self.ids.waiting_total() else {}

    # --- what happened ----------------------------------------------------------------------

    def queue(self, target: str, pj: Pending, now: float) -> None:
        self.sched.push(target, pj, now, tier=pj.tier, revisit=pj.revisit)

    def requeue(self, target: str, pj: Pending, now: float) -> None:
        """``pj`` goes back to the front of its target's queue (it was taken, not sent)."""
        self.sched.push_front(target, pj, now, tier=pj.tier, revisit=pj.revisit)

    def take_tail(self, target: str, keep: int) -> list[Pending]:
        """``target``'s queued jobs beyond its first ``keep`` (to go to disk)."""
        return self.sched.take_tail(target, keep)

    def refund(self, target: str, now: float) -> None:
        """A released job sent no request: the target's slot is given back."""
        self.sched.refund(target, now)

    def done(self, target: str, now: float) -> None:
        self.sched.done(target, now)

    async def spaced(self, target: str) -> None:
        """Wait until a request to ``target`` may leave (an interval after the last one
        did), then count it as left."""
        now = time.monotonic()
        delay = self.sched.reserve_send(target, now) - now
        if delay > 0:
            self.status.add("send_spacing_waits")
            await asyncio.sleep(delay)
        self.sched.sent(target, time.monotonic())  # left later than reserved: the next waits

    def sent_as(self, target: str, profile: str) -> None:
        """The site has seen ``profile`` now (after a block it stays eligible there)."""
        self.ids.sent(target, profile)

    def after_robots(self, target: str, now: float) -> None:
        """The target's next request leaves a full interval after its robots.txt answer."""
        self.sched.defer(target, now + self.policy.interval(target))

    def observe(self, target: str, signal: Signal, retry_after_s: float | None,
                now: float, url: str | None = None) -> Observed:
        """A request's signal (of ``url``): the target's adaptive limits hear it; what it
        asks back."""
        return self.policy.observe(target, signal, retry_after_s, now, url)

    def observe_identity(self, target: str, pj: Pending, signal: Signal, now: float,
                         reason: str = "") -> None:
        """The signal (and failure class) of a request sent as ``pj``'s identity: its
        pair's session and its egress's health."""
        self.ids.observe(target, pj.profile, pj.egress, signal, now, reason)

    def defer(self, target: str, wait: float, now: float) -> bool:
        """No request to ``target`` for ``wait`` s; True: the rest is long, its queue
        goes to disk."""
        self.status.add("deferrals")
        return self.policy.defer(target, wait, now)

    # --- memory: shares, parking, forgetting ------------------------------------------------

    def must_park(self, target: str, queue: int, now: float) -> bool:
        """Whether a new job of queue number ``queue`` goes to disk: behind what its queue
        has parked, beyond the target's share, or no room for one more target's state."""
        return self.policy.must_park(target, queue, now, self.parked.must_park(target, queue))

    def resting(self, target: str, now: float) -> bool:
        return self.policy.resting(target, now)

    def room_for(self, target: str, now: float) -> bool:
        return self.policy.room_for(target, now)

    def share(self, target: str) -> int:
        return self.policy.share(target)

    def held(self, target: str, queue: int) -> int:
        return self.policy.held(target, queue)

    def due_wakes(self, now: float) -> list[str]:
        return self.policy.due_wakes(now)

    def buffered(self) -> int:
        """Jobs held in memory: queued, and waiting for an identity."""
        return len(self.sched) + self.ids.waiting_total()

    def forget_idle(self, now: float) -> None:
        self.policy.forget_idle(now)

    # --- ownership --------------------------------------------------------------------------

    def handover(self, taken: Callable[[str], bool], now: float) -> None:
        self.sched.handover(taken, now)

    def keep_only(self, owned: Callable[[str], bool]) -> list[Pending]:
        """Forget the identity state of targets not ``owned``; returns their waiting jobs."""
        return self.ids.keep_only(owned)

    def drop(self, keep: Callable[[Pending], bool]) -> None:
        self.sched.drop(keep)
