"""Placement wired into a real fetch session (no broker: its Kafka calls are not reached):
a pinned job whose pair is quarantined waits without spending its target's slot and goes
again, as its own profile, once the quarantine is lifted; an unpinned one is re-placed on
another already-used profile; the records of an attempt name the placed profile and its
egress (which the retry keeps, so its next attempt can avoid it); a revoked partition's
waiting jobs and cookie jars go with it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from consumers.fetch.classify import Signal
from consumers.fetch.stage import _Session
from core.errors import CrawlfleetError
from core.profiles import EGRESS_META
from schemas.codec import default_codec
from streams.control import ControlState, Quarantine, quarantine_key
from streams.ledger import Pending
from tests.unit.fetch_session import run_session
from tests.unit.test_target_memory import RobotsFetcher

T = "site.test"
UA = "{}bot/1.0 (+https://example.org/bot)"


def _run(tmp_path: Path, body: Any) -> Any:
    return run_session(tmp_path, body, default_profile="alpha", profiles={
        n: {"user_agent": UA.format(n), "region": "local", "cookies": True}
        for n in ("alpha", "beta", "gamma")})


def _pj(session: _Session, n: int, profile: str, pinned: bool) -> Pending:
    job: Any = {"url": f"http://{T}/{n}", "profile": profile, "pinned": pinned, "target": T,
                "depth": 1, "attempt": 0, "priority": 0, "parent_url": None,
                "last_error": None, "delay_ms": 0, "meta": {}}
    pj = Pending((session.topo.frontier, 0), n, session.ledger.epochs[(session.topo.frontier,
                                                                      0)], job, f"k{n}")
    session.ledger.admit(pj.tp, n)
    session.ledger.hold(pj)
    return pj


def _control(*qs: Quarantine) -> ControlState:
    state = ControlState()
    for q in qs:
        state.apply(quarantine_key(q.scope, q.target, q.name), q.record("test"))
    return state


def _q(name: str) -> Quarantine:
    return Quarantine("profile", T, name, int(time.time() * 1000) + 60_000, "3 blocks")


def test_a_quarantined_pinned_job_waits_then_goes_as_its_own_profile(tmp_path: Path) -> None:
    async def body(session: _Session) -> None:
        d = session.dispatch
        d.apply_control(_control(_q("alpha")))
        now = time.monotonic()
        held, other = _pj(session, 1, "alpha", True), _pj(session, 2, "beta", True)
        session.sched.push(T, held, now)
        session.sched.push(T, other, now)
        [(_, first)] = session.sched.pop_ready(now, 1)
        assert first is held and d.place(T, held, now) is False
        session.sched.done(T, now)
        assert session.policy.identities.waiting(T) == 1
        # its slot was given back: the target's next job goes at once, as its own profile
        [(_, second)] = session.sched.pop_ready(now, 1)
        assert second is other and d.place(T, other, now) and other.profile == "beta"
        session.sched.done(T, now)
        time.sleep(0.01)  # past the target's interval (1 ms): its next slot is due
        d.apply_control(_control(_q("alpha")))  # still quarantined: waits again
        [(_, again)] = session.sched.pop_ready(time.monotonic(), 1)
        assert again is held and not d.place(T, held, time.monotonic())
        session.sched.done(T, time.monotonic())
        time.sleep(0.01)
        d.apply_control(_control())  # lifted
        [(_, last)] = session.sched.pop_ready(time.monotonic(), 1)
        assert last is held and d.place(T, held, time.monotonic())
        assert held.profile == "alpha" and held.egress == "direct"

    _run(tmp_path, body)


def test_an_unpinned_job_is_re_placed_on_an_already_used_profile(tmp_path: Path) -> None:
    async def body(session: _Session) -> set[str]:
        d, ids = session.dispatch, session.policy.identities
        ids.sent(T, "alpha")
        ids.sent(T, "beta")
        d.apply_control(_control(_q("alpha")))
        placed = set()
        for n in range(6):
            pj = _pj(session, n, "alpha", False)
            assert d.place(T, pj, time.monotonic())
            placed.add(pj.profile)
        return placed

    assert _run(tmp_path, body) == {"beta"}  # never alpha (retired), never gamma (fresh)


def test_an_attempts_records_name_its_placed_profile_and_egress(tmp_path: Path) -> None:
    async def body(session: _Session) -> list[Any]:
        pj = _pj(session, 1, "alpha", False)
        pj.profile, pj.egress = "beta", "direct"
        res = session.rules.retry_or_dead(pj, "http_429", 1.0, 429, time.monotonic())
        codec = default_codec()
        return [codec.decode(kind, o.value, o.headers)
                for kind, o in zip(("CrawlJob", "FetchEvent"), res.outputs, strict=True)]

    retry, event = _run(tmp_path, body)
    assert retry["profile"] == "beta" and retry["meta"][EGRESS_META] == "direct"
    assert retry["last_error"] == "http_429"
    assert event["profile"] == "beta"


def test_a_revoked_partition_takes_its_waiting_jobs_and_jars_along(tmp_path: Path) -> None:
    async def body(session: _Session) -> None:
        d, ids = session.dispatch, session.policy.identities
        jar = ids.jar(T, "alpha")
        d.apply_control(_control(_q("alpha")))
        pj = _pj(session, 1, "alpha", True)
        assert not d.place(T, pj, time.monotonic())
        d.keep_only(set())  # partition 0 is gone
        assert ids.waiting(T) == 0 and T not in ids.targets
        assert ids.jar(T, "alpha") is not jar

    _run(tmp_path, body)


def test_a_pinned_job_of_an_unknown_profile_is_never_sent_as_another(tmp_path: Path) -> None:
    async def body(session: _Session) -> None:
        d = session.dispatch
        ghost = _pj(session, 3, "ghost", True)
        try:
            d.identity(ghost)
        except CrawlfleetError as exc:
            assert exc.reason == "unknown_profile" and not exc.retryable
        else:
            raise AssertionError("a pinned ghost-profile job got an identity")
        loose = _pj(session, 4, "ghost", False)  # unpinned: any identity of this worker
        assert d.identity(loose).headers["User-Agent"] == UA.format("alpha")
        assert loose.profile == "alpha"

    _run(tmp_path, body)


def test_the_profile_that_asked_for_robots_txt_stays_eligible_after_a_block(
        tmp_path: Path) -> None:
    async def body(session: _Session) -> None:
        d = session.dispatch
        d.fetcher = RobotsFetcher()  # type: ignore[assignment]
        session.robots.fetcher = d.fetcher  # type: ignore[assignment]
        pj = _pj(session, 5, "alpha", False)
        now = time.monotonic()
        assert d.place(T, pj, now) and pj.profile == "alpha"
        d.running += 1
        await d.fetch(pj)  # the slot went on robots.txt, asked as alpha; the job requeued
        ids = session.policy.identities
        ids.sent(T, "beta")
        ids.observe(T, "beta", "direct", Signal.BLOCKED, time.monotonic())  # beta refused
        # The site has seen alpha (its robots.txt request): alpha may carry the target's
        # work on; beta, refused, may too until quarantined; gamma, never seen, may not.
        placed = {ids.place(T, "alpha", False, int(time.time() * 1000)) for _ in range(6)}
        assert "alpha" in placed and "gamma" not in placed

    _run(tmp_path, body)
