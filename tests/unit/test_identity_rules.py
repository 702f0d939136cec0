"""Identities: placement, egress choice and health, cookie jars' lifecycle, bounds.

Pure logic (consumers.fetch.identities), plus the per-target policy and the dispatcher's
revocation path that own it; no broker, no network.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest
from yarl import URL

from consumers.fetch.classify import Signal
from consumers.fetch.egress_health import EgressHealth, egress_fault
from consumers.fetch.identities import Identities
from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import TargetScheduler
from consumers.fetch.target_policy import TargetPolicy
from core.config import Settings
from core.profiles import Egress, Profile
from streams.control import Quarantine

T, U = "site.test", "other.test"
NOW_MS = 1_000_000


def _profile(name: str, egress: tuple[str, ...] = ("direct",), cookies: bool = True,
             targets: tuple[str, ...] = ()) -> Profile:
    return Profile(name, f"{name}bot/1.0 (+https://example.org/bot)", f"{name}bot", "local",
                   egress=egress, cookies=cookies, targets=targets)


EGRESS = {"direct": Egress("direct", "local"),
          "p1": Egress("p1", "local", "http://127.0.0.1:1"),
          "p2": Egress("p2", "local", "http://127.0.0.1:2")}


def _ids(*profiles: Profile, failures: int = 3, window_s: float = 10.0,
         cooloff_s: float = 30.0) -> Identities:
    return Identities({p.name: p for p in profiles}, EGRESS, (403,),
                      EgressHealth(failures, window_s, cooloff_s))


def _q(scope: str, target: str, name: str, until_ms: int = NOW_MS + 60_000) -> Quarantine:
    return Quarantine(scope, target, name, until_ms, "3 blocks in 600s")


# --- placement -------------------------------------------------------------------------


def test_a_pinned_job_goes_as_its_profile_and_waits_while_that_pair_is_quarantined() -> None:
    ids = _ids(_profile("a"), _profile("b"))
    assert ids.place(T, "a", True, NOW_MS) == "a"
    ids.apply_quarantines([_q("profile", T, "a")], NOW_MS)
    assert ids.place(T, "a", True, NOW_MS) is None  # waits: never sent as "b"
    assert ids.place(U, "a", True, NOW_MS) == "a"  # the pair only: other targets keep it
    assert ids.place(T, "a", True, NOW_MS + 60_000) == "a"  # the quarantine ended


def test_unpinned_jobs_go_round_robin_over_the_profiles_allowed_for_the_target() -> None:
    ids = _ids(_profile("a"), _profile("b"), _profile("c", targets=(U,)))
    placed = [ids.place(T, "a", False, NOW_MS) for _ in range(6)]
    assert placed == ["a", "b", "a", "b", "a", "b"]  # "c" is not allowed for T
    assert {ids.place(U, "a", False, NOW_MS) for _ in range(6)} == {"a", "b", "c"}


def test_after_a_block_only_profiles_that_already_made_a_request_are_eligible() -> None:
    ids = _ids(_profile("a"), _profile("b"), _profile("c"))
    ids.sent(T, "a")
    ids.sent(T, "b")
    ids.observe(T, "a", "direct", Signal.BLOCKED, 0.0)
    placed = {ids.place(T, "x", False, NOW_MS) for _ in range(9)}
    assert placed == {"a", "b"}  # never the fresh "c": that would evade the block
    assert {ids.place(U, "x", False, NOW_MS) for _ in range(9)} == {"a", "b", "c"}


def test_a_quarantine_contains_the_target_and_excludes_the_retired_profile() -> None:
    ids = _ids(_profile("a"), _profile("b"), _profile("c"))
    ids.sent(T, "a")
    ids.sent(T, "b")
    ids.apply_quarantines([_q("profile", T, "a")], NOW_MS)
    assert {ids.place(T, "x", False, NOW_MS) for _ in range(6)} == {"b"}


def test_with_no_eligible_profile_an_unpinned_job_waits() -> None:
    ids = _ids(_profile("a"), _profile("b"))
    ids.sent(T, "a")
    ids.observe(T, "a", "direct", Signal.THROTTLED, 0.0)  # a 429 is a block too
    ids.apply_quarantines([_q("profile", T, "a")], NOW_MS)
    assert ids.place(T, "a", False, NOW_MS) is None  # "b" never made a request to T
    ids.wait(T, "job-1")
    assert ids.waiting(T) == 1 and ids.forget(T) is False  # kept while a job waits
    assert ids.take_waiting() == {T: ["job-1"]}
    assert ids.waiting(T) == 0


def test_a_target_quarantine_is_reported_and_ends_on_its_own() -> None:
    ids = _ids(_profile("a"))
    ids.apply_quarantines([_q("target", T, "", until_ms=NOW_MS + 5)], NOW_MS)
    q = ids.target_quarantine(T, NOW_MS)
    assert q is not None and q.reason == "3 blocks in 600s"
    assert ids.target_quarantine(U, NOW_MS) is None
    assert ids.quarantined_targets(NOW_MS) == [T]
    assert ids.target_quarantine(T, NOW_MS + 5) is None


# --- egress ----------------------------------------------------------------------------


def test_attempts_spread_over_the_pool_and_a_retry_after_a_block_takes_another() -> None:
    ids = _ids(_profile("a", egress=("p1", "p2")))
    first = [ids.choose_egress(T, "a", None, None, 0.0, NOW_MS) or "" for _ in range(4)]
    assert sorted(first) == ["p1", "p1", "p2", "p2"]
    for reason in ("http_403", "http_429", "timeout", "connect"):
        for last in ("p1", "p2"):
            picks = {ids.choose_egress(T, "a", last, reason, 0.0, NOW_MS) for _ in range(4)}
            assert picks == {"p2" if last == "p1" else "p1"}, (reason, last)
    # A retry after a 5xx says nothing about the egress: either may go.
    assert {ids.choose_egress(T, "a", "p1", "http_503", 0.0, NOW_MS)
            for _ in range(4)} == {"p1", "p2"}


def test_a_retry_keeps_its_only_egress() -> None:
    ids = _ids(_profile("a", egress=("p1",)))
    assert ids.choose_egress(T, "a", "p1", "timeout", 0.0, NOW_MS) == "p1"


def test_an_egress_cools_off_after_n_faults_of_its_own_on_two_targets_and_comes_back() -> None:
    ids = _ids(_profile("a", egress=("p1", "p2")), failures=3, window_s=10.0, cooloff_s=30.0)
    ids.observe(T, "a", "p1", Signal.ERROR, 0.0, "timeout")
    ids.observe(U, "a", "p1", Signal.ERROR, 1.0, "connect")
    ids.observe(T, "a", "p1", Signal.OK, 2.0, "ok")  # a success is no fault
    assert {ids.choose_egress(T, "a", None, None, 3.0, NOW_MS) for _ in range(4)} \
        == {"p1", "p2"}  # two faults: still healthy
    ids.observe(T, "a", "p1", Signal.NEUTRAL, 4.0, "proxy")  # the third within 10 s
    assert {ids.choose_egress(T, "a", None, None, 5.0, NOW_MS) for _ in range(4)} == {"p2"}
    assert {ids.choose_egress(U, "a", None, None, 33.0, NOW_MS) for _ in range(4)} == {"p2"}
    assert {ids.choose_egress(T, "a", None, None, 34.0, NOW_MS) for _ in range(4)} \
        == {"p1", "p2"}  # back after its cool-off


@pytest.mark.parametrize("failures", [1, 2, 5])
def test_blocks_never_cool_an_egress_off_however_tight_the_setting(failures: int) -> None:
    """One site banning an exit (403s, 429s) is that site's verdict: the quarantine's to
    count per (target, egress), never a reason to take the exit from every other site."""
    ids = _ids(_profile("a", egress=("p1", "p2")), failures=failures, window_s=10.0)
    for i in range(20):
        ids.observe(T, "a", "p1", Signal.BLOCKED, i * 0.1, "http_403")
        ids.observe(U, "a", "p1", Signal.THROTTLED, i * 0.1, "http_429")
    assert ids.health.cooling(3.0) == []
    assert {ids.choose_egress(U, "a", None, None, 3.0, NOW_MS) for _ in range(4)} \
        == {"p1", "p2"}


@pytest.mark.parametrize("failures", [1, 2, 5])
def test_faults_on_one_target_alone_never_cool_an_egress_off(failures: int) -> None:
    """A site that is down looks like timeouts and refused connections through every
    exit: the target's own back-off paces it; the exit stays for the others."""
    health = EgressHealth(failures, 10.0, 30.0)
    assert not any(health.record("p1", T, i * 0.1) for i in range(3 * failures))
    assert health.record("p1", U, 1.0) is True  # a second target's fault: the egress's own
    assert health.cooling(2.0) == ["p1"]


def test_the_tightest_setting_takes_two_faults_on_two_targets() -> None:
    health = EgressHealth(1, 10.0, 30.0)
    assert health.record("p1", T, 0.0) is False
    assert health.record("p1", U, 0.5) is True


def test_faults_spread_wider_than_the_window_never_cool_an_egress_off() -> None:
    health = EgressHealth(3, 10.0, 30.0)
    assert [health.record("p1", (T, U)[i % 2], t)
            for i, t in enumerate((0.0, 6.0, 12.0, 18.0, 24.0))] == [False] * 5
    assert health.record("p1", T, 25.0) is True  # 18, 24, 25: three within 10 s, 2 targets


def test_only_the_egresss_own_failure_classes_are_faults() -> None:
    assert {r for r in ("connect", "timeout", "proxy", "http_407", "http_403", "http_429",
                        "http_503", "truncated_body", "tls", "ok", "address_not_allowed")
            if egress_fault(r)} == {"connect", "timeout", "proxy", "http_407"}


def test_a_whole_pool_cooling_off_still_goes_through_the_first_to_recover() -> None:
    ids = _ids(_profile("a", egress=("p1", "p2")), failures=1, cooloff_s=30.0)
    ids.observe(T, "a", "p2", Signal.ERROR, 0.0, "connect")
    ids.observe(U, "a", "p2", Signal.ERROR, 0.0, "connect")
    ids.observe(T, "a", "p1", Signal.ERROR, 1.0, "timeout")
    ids.observe(U, "a", "p1", Signal.ERROR, 1.0, "timeout")
    assert {ids.choose_egress(T, "a", None, None, 2.0, NOW_MS) for _ in range(3)} == {"p2"}


def test_an_egress_quarantine_excludes_that_egress_for_its_target_only() -> None:
    ids = _ids(_profile("a", egress=("p1", "p2")))
    ids.apply_quarantines([_q("egress", T, "p1")], NOW_MS)
    assert {ids.choose_egress(T, "a", None, None, 0.0, NOW_MS) for _ in range(4)} == {"p2"}
    assert {ids.choose_egress(U, "a", None, None, 0.0, NOW_MS) for _ in range(4)} \
        == {"p1", "p2"}
    ids.apply_quarantines([_q("egress", T, "p1"), _q("egress", T, "p2")], NOW_MS)
    assert ids.choose_egress(T, "a", None, None, 0.0, NOW_MS) is None  # the job waits


# --- cookie jars -----------------------------------------------------------------------


def in_loop(test: Callable[..., None]) -> Callable[..., None]:
    """Run a test body on an event loop: aiohttp's cookie jar is made on the running one
    (as a fetch worker makes it, at dispatch)."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        async def body() -> None:
            test(*args, **kwargs)
        asyncio.run(body())
    return run


def _set(jar: Any, target: str, name: str = "sid", value: str = "1") -> None:
    from http.cookies import SimpleCookie
    cookie: SimpleCookie = SimpleCookie()
    cookie[name] = value
    jar.update_cookies(cookie, URL(f"http://{target}/"))


def _names(jar: Any, target: str) -> set[str]:
    return set(jar.filter_cookies(URL(f"http://{target}/")))


@in_loop
def test_each_pair_gets_a_fresh_jar_and_a_profile_without_cookies_gets_none() -> None:
    ids = _ids(_profile("a"), _profile("b"), _profile("off", cookies=False))
    jar = ids.jar(T, "a")
    assert jar is not None
    _set(jar, T)
    assert ids.jar(T, "a") is jar and _names(jar, T) == {"sid"}
    other = ids.jar(T, "b")
    assert other is not None and other is not jar and _names(other, T) == set()
    assert ids.jar(U, "a") is not jar
    assert ids.jar(T, "off") is None


@pytest.mark.parametrize("signal", [Signal.BLOCKED, Signal.THROTTLED])
@in_loop
def test_a_block_drops_the_pairs_jar_only(signal: Signal) -> None:
    ids = _ids(_profile("a"), _profile("b"))
    jar_a, jar_b = ids.jar(T, "a"), ids.jar(T, "b")
    _set(jar_a, T)
    _set(jar_b, T)
    ids.observe(T, "a", "direct", Signal.ERROR, 0.0)  # a 5xx or timeout keeps the session
    assert ids.jar(T, "a") is jar_a
    ids.observe(T, "a", "direct", signal, 0.0)
    fresh = ids.jar(T, "a")
    assert fresh is not None and fresh is not jar_a and _names(fresh, T) == set()
    assert ids.jar(T, "b") is jar_b
    assert ids.jars_dropped == 1


@in_loop
def test_a_profile_quarantine_drops_the_pairs_jar() -> None:
    ids = _ids(_profile("a"))
    jar = ids.jar(T, "a")
    ids.apply_quarantines([_q("egress", T, "direct")], NOW_MS)
    assert ids.jar(T, "a") is jar  # an egress quarantine is no reason to drop the session
    ids.apply_quarantines([_q("profile", T, "a")], NOW_MS)
    assert ids.jar(T, "a") is not jar


@in_loop
def test_revocation_drops_the_targets_identity_state_and_hands_back_waiting_jobs() -> None:
    ids = _ids(_profile("a"))
    jar_t, jar_u = ids.jar(T, "a"), ids.jar(U, "a")
    ids.wait(T, "job-t")
    released = ids.keep_only(lambda target: target == U)
    assert released == ["job-t"]
    assert ids.jar(T, "a") is not jar_t and ids.jar(U, "a") is jar_u
    assert ids.counts()["identity_waiting"] == 0


# --- bounds ----------------------------------------------------------------------------


def _policy(**kw: Any) -> TargetPolicy:
    s = Settings(**kw)
    sched: TargetScheduler[Any] = TargetScheduler(lambda t: 0.5)
    box: list[TargetPolicy] = []
    robots = RobotsCache("crawlfleet", 3600.0, lambda t, i: box[0].on_robots(t, i))
    box.append(TargetPolicy(s, sched, robots, s.cap_for))
    return box[0]


def test_identity_state_is_forgotten_with_its_idle_target() -> None:
    policy = _policy(target_idle_s=60.0)
    ids = policy.identities
    jar = ids.jar("idle.test", "default")
    assert jar is None  # the implicit default profile has cookies off
    ids.sent("idle.test", "default")
    ids.sent("busy.test", "default")
    policy.sched.push("idle.test", "j1", 0.0)
    policy.sched.pop_ready(0.0, 1)
    policy.sched.done("idle.test", 0.0)
    policy.sched.push("busy.test", "j2", 0.0)  # queued work: never forgotten
    policy.forget_idle(100.0)
    assert "idle.test" not in ids.targets
    assert "busy.test" in ids.targets
    assert policy.memory_counts()["identity_targets"] == 1


def test_identity_targets_stay_within_max_target_state() -> None:
    policy = _policy(max_target_state=20)
    ids = policy.identities
    for n in range(200):  # a site minting host names
        target = f"h{n}.mint.test"
        assert policy.room_for(target, float(n))
        policy.sched.push(target, n, float(n))
        policy.sched.pop_ready(float(n), 1)
        ids.sent(target, "default")
        policy.sched.done(target, float(n))
    assert len(ids.targets) <= 20
    assert policy.memory_counts()["identity_pairs_peak"] <= 21


def test_a_block_rests_its_target_and_no_other() -> None:
    """The target-scoped cool-off: a block stretches the target's interval (its next
    request waits longer), a neighbour keeps its pace."""
    policy = _policy(rate_cap=2.0)
    before = policy.interval(T)
    policy.observe(T, Signal.BLOCKED, None, 0.0)
    assert policy.interval(T) >= 2 * before
    assert policy.interval(U) == before
