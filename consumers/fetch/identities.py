"""Who a fetch worker's requests are sent as: placement, cookie jars and egress, pure logic.

A *profile* is a crawl identity (User-Agent, headers, cookie policy, egress pool); an
*egress* is a way out (``direct`` or a forward proxy). This module decides, for one
attempt, which profile it goes as and through which egress, and keeps the state that
belongs to a (target, profile) pair: its cookie jar and whether it has made a request.
No Kafka, no clock of its own (times are arguments), so every rule is testable alone.

Politeness rules, never evasion:

- a pinned job only ever goes as its own profile; while that pair is quarantined it waits;
- an unpinned job goes round-robin over the healthy profiles allowed for its target, but
  once the target has blocked us (or had a quarantine) only profiles that already made a
  request there are eligible: moving to a fresh identity after a block would be evading
  it. None eligible: the job waits;
- a block (a block status, 429) drops the pair's cookie jar, and a profile quarantine
  does too; so do losing the target's partition and the session ending (the state lives
  in the session, never in a record or topic);
- an egress is chosen per attempt from the profile's pool, skipping egresses quarantined
  for this target and, when the pool has another, egresses cooling off for faults of their
  own seen on several targets (:mod:`consumers.fetch.egress_health`: never for blocks, which
  are one target's verdict and the quarantine's to count); a retry after a block, timeout,
  refused connection or proxy error avoids the egress the last attempt used.

The state is per target and forgotten with the rest of the target's state
(:meth:`consumers.fetch.target_policy.TargetPolicy.forget_idle`), so ``max_target_state`` bounds
it; each target holds at most one pair per configured profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from consumers.fetch.classify import Signal
from consumers.fetch.egress_health import EgressHealth, egress_fault
from core.config import Settings
from core.profiles import Egress, Profile
from streams.control import Quarantine

#: Failure classes after which a retry takes another egress when the pool has one.
SWITCH_REASONS = frozenset({"timeout", "connect", "proxy", "http_407", "http_429"})
#: A waiting job is looked at again this often (and at once when the control state
#: changes), so a quarantine that ends on its own releases it.
WAIT_RECHECK_S = 2.0
#: Cookies one jar may hold; a site setting more starts its jar afresh (bounded memory).
MAX_COOKIES_PER_JAR = 300


class PairState:
    """One (target, profile) pair: its cookie jar (None: cookies off for the profile, or
    not made yet) and whether it has made a request to the target."""

    __slots__ = ("jar", "used")

    def __init__(self) -> None:
        self.jar: aiohttp.CookieJar | None = None
        self.used = False


class TargetIdentities:
    """What one target holds: its pairs, whether it has pushed back (a block or a
    quarantine: from then on only used profiles are eligible), the round-robin position
    of its unpinned placements, and the jobs waiting for an eligible profile or egress."""

    __slots__ = ("contained", "pairs", "rr", "waiting")

    def __init__(self) -> None:
        self.pairs: dict[str, PairState] = {}
        self.contained = False
        self.rr = 0
        self.waiting: list[Any] = []

    def used(self, profile: str) -> bool:
        pair = self.pairs.get(profile)
        return pair is not None and pair.used


class Identities:
    """The identity state of one fetch worker's session (dropped with the session).

    ``profiles`` and ``egress`` are the configured tables; ``block_statuses`` the statuses
    that mean a block (429 always does).
    """

    @classmethod
    def of(cls, s: Settings) -> Identities:
        return cls(s.profile_table, s.egress_table, s.block_statuses,
                   EgressHealth(s.egress_failures, s.egress_window_s, s.egress_cooloff_s))

    def __init__(self, profiles: dict[str, Profile], egress: dict[str, Egress],
                 block_statuses: Iterable[int], health: EgressHealth) -> None:
        self.profiles = profiles
        self.egress = egress
        self.health = health
        self.switch_reasons = SWITCH_REASONS | {f"http_{s}" for s in block_statuses}
        self.targets: dict[str, TargetIdentities] = {}
        self._profile_q: dict[tuple[str, str], Quarantine] = {}
        self._egress_q: dict[tuple[str, str], Quarantine] = {}
        self._target_q: dict[str, Quarantine] = {}
        self._by_target: dict[str, list[Quarantine]] = {}  # every scope's, by target
        self._egress_rr: dict[str, int] = {}
        self.jars_dropped = 0
        self.pairs_peak = 0
        self._pairs = 0  # sizes kept as they change: the gauges never scan the targets
        self._jars = 0
        self._waiting = 0

    # --- per-target state -----------------------------------------------------------------

    def _target(self, target: str) -> TargetIdentities:
        t = self.targets.get(target)
        if t is None:
            t = self.targets[target] = TargetIdentities()
        return t

    def _pair(self, target: str, profile: str) -> PairState:
        t = self._target(target)
        pair = t.pairs.get(profile)
        if pair is None:
            pair = t.pairs[profile] = PairState()
            self._pairs += 1
            self.pairs_peak = max(self.pairs_peak, self._pairs)
        return pair

    def jar(self, target: str, profile: str) -> aiohttp.CookieJar | None:
        """The pair's cookie jar, made fresh on first use; None for a profile without
        cookies (it sends none). ``unsafe``: a target named by an IP address keeps its
        cookies too (aiohttp otherwise refuses cookies from IP hosts)."""
        p = self.profiles.get(profile)
        if p is None or not p.cookies:
            return None
        pair = self._pair(target, profile)
        if pair.jar is None:
            pair.jar = aiohttp.CookieJar(unsafe=True)
            self._jars += 1
        elif len(pair.jar) > MAX_COOKIES_PER_JAR:
            pair.jar.clear()
        return pair.jar

    def sent(self, target: str, profile: str) -> None:
        """The pair made a request to the target (it is eligible after a block)."""
        self._pair(target, profile).used = True

    def _drop_jar(self, target: str, profile: str) -> None:
        t = self.targets.get(target)
        pair = t.pairs.get(profile) if t is not None else None
        if pair is not None and pair.jar is not None:
            pair.jar = None
            self._jars -= 1
            self.jars_dropped += 1

    def forget(self, target: str) -> bool:
        """Drop ``target``'s state with the rest of its per-target state (it was idle);
        kept (False) while jobs of it wait for an identity."""
        t = self.targets.get(target)
        if t is None:
            return True
        if t.waiting:
            return False
        self._dropped(t)
        del self.targets[target]
        return True

    def _dropped(self, t: TargetIdentities) -> None:
        self._pairs -= len(t.pairs)
        self._jars -= sum(1 for p in t.pairs.values() if p.jar is not None)
        self._waiting -= len(t.waiting)

    def keep_only(self, owned: Callable[[str], bool]) -> list[Any]:
        """Drop the state of targets whose partition this worker no longer owns; returns
        their waiting jobs (the caller releases them: the new owner redoes them)."""
        released: list[Any] = []
        for target in [t for t in self.targets if not owned(t)]:
            t = self.targets.pop(target)
            self._dropped(t)
            released += t.waiting
        return released

    # --- signals and quarantines ----------------------------------------------------------

    def observe(self, target: str, profile: str, egress: str, signal: Signal,
                now: float, reason: str = "") -> None:
        """What one finished request said: a block (block status, 429) drops the pair's
        jar and contains the target; a fault of the egress's own (``reason``: a failed
        connection, a timeout, a proxy error) counts against the egress. A block never
        does: it is this target's verdict on this identity (the quarantine counts it)."""
        if signal is Signal.BLOCKED or signal is Signal.THROTTLED:
            self._drop_jar(target, profile)
            self._target(target).contained = True
        if egress_fault(reason):
            self.health.record(egress, target, now)

    def apply_quarantines(self, quarantines: Iterable[Quarantine], now_ms: int) -> None:
        """The control topic's quarantines in force: a profile one retires its pair (jar
        dropped, target contained), an egress one excludes that egress for its target
        only, a target one holds the target (see :meth:`target_quarantine`)."""
        self._profile_q.clear()
        self._egress_q.clear()
        self._target_q.clear()
        self._by_target.clear()
        for q in quarantines:
            if not q.active(now_ms):
                continue
            self._by_target.setdefault(q.target, []).append(q)
            if q.scope == "profile":
                self._profile_q[(q.target, q.name)] = q
                self._drop_jar(q.target, q.name)
            elif q.scope == "egress":
                self._egress_q[(q.target, q.name)] = q
            else:
                self._target_q[q.target] = q
            t = self.targets.get(q.target)
            if t is not None:
                t.contained = True

    def _active(self, table: dict[Any, Quarantine], key: Any, now_ms: int) -> bool:
        q = table.get(key)
        return q is not None and q.active(now_ms)

    def profile_quarantined(self, target: str, profile: str, now_ms: int) -> bool:
        return self._active(self._profile_q, (target, profile), now_ms)

    def egress_quarantined(self, target: str, egress: str, now_ms: int) -> bool:
        return self._active(self._egress_q, (target, egress), now_ms)

    def target_quarantine(self, target: str, now_ms: int) -> Quarantine | None:
        """The quarantine holding the whole target, if one is in force."""
        q = self._target_q.get(target)
        return q if q is not None and q.active(now_ms) else None

    def quarantined_targets(self, now_ms: int) -> list[str]:
        """Targets a target-scoped quarantine holds now."""
        return [t for t, q in self._target_q.items() if q.active(now_ms)]

    def contained(self, target: str, now_ms: int) -> bool:
        """Whether ``target`` has pushed back: a block seen here, or a quarantine of it."""
        t = self.targets.get(target)
        if t is not None and t.contained:
            return True
        return any(q.active(now_ms) for q in self._by_target.get(target, ()))

    # --- placement ------------------------------------------------------------------------

    def place(self, target: str, profile: str, pinned: bool, now_ms: int) -> str | None:
        """The profile an attempt goes as, or None: it waits (no eligible profile now).

        Pinned: its own profile unless that pair is quarantined. Unpinned: round-robin over
        the profiles allowed for the target and not quarantined there; once the target has
        pushed back, only those that already made a request to it.
        """
        if pinned:
            return None if self.profile_quarantined(target, profile, now_ms) else profile
        eligible = [name for name, p in self.profiles.items()
                    if p.allowed_for(target) and not self.profile_quarantined(target, name,
                                                                              now_ms)]
        if eligible and self.contained(target, now_ms):
            t = self.targets.get(target)
            eligible = [n for n in eligible if t is not None and t.used(n)]
        if not eligible:
            return None
        t = self._target(target)
        chosen = eligible[t.rr % len(eligible)]
        t.rr += 1
        return chosen

    def choose_egress(self, target: str, profile: str, last: str | None,
                      last_error: str | None, now: float, now_ms: int) -> str | None:
        """The egress an attempt of ``profile`` goes through, or None: every egress of the
        pool is quarantined for this target (the job waits).

        Round-robin over the pool, skipping egresses cooling off while another is
        healthy (cool-off moves attempts to the rest of the pool; it never stops a
        profile whose whole pool is sick: the target's own back-off paces those), and
        avoiding ``last`` after a block, timeout or refused connection when another is left.
        """
        p = self.profiles[profile]
        pool = [e for e in p.egress
                if e in self.egress and not self.egress_quarantined(target, e, now_ms)]
        if not pool:
            return None
        healthy = [e for e in pool if not self.health.cool_until(e, now)]
        if not healthy:
            healthy = [min(pool, key=lambda e: self.health.cool_until(e, now))]
        if last is not None and last_error in self.switch_reasons and len(healthy) > 1:
            healthy = [e for e in healthy if e != last] or healthy
        n = self._egress_rr.get(profile, 0)
        self._egress_rr[profile] = n + 1
        return healthy[n % len(healthy)]

    # --- jobs waiting for an identity -----------------------------------------------------

    def wait(self, target: str, job: Any) -> None:
        """Hold ``job`` until a profile or egress is eligible for it (never dropped)."""
        self._target(target).waiting.append(job)
        self._waiting += 1

    def waiting(self, target: str) -> int:
        t = self.targets.get(target)
        return len(t.waiting) if t is not None else 0

    def take_waiting(self) -> dict[str, list[Any]]:
        """Every waiting job by target, removed (the caller queues them again in order)."""
        out = {target: t.waiting for target, t in self.targets.items() if t.waiting}
        for target, jobs in out.items():
            self.targets[target].waiting = []
            self._waiting -= len(jobs)
        return out

    def waiting_total(self) -> int:
        return self._waiting

    # --- gauges ---------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Sizes for the status file (kept as they change, never scanned): targets and
        pairs held (and the most pairs held at once), live cookie jars, jobs waiting."""
        return {"identity_targets": len(self.targets), "identity_pairs": self._pairs,
                "identity_pairs_peak": self.pairs_peak, "cookie_jars": self._jars,
                "identity_waiting": self._waiting}
