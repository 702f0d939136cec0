"""The fetch session keeps every per-target map within ``max_target_state`` where entries
are made, not only after its next sweep: a batch of jobs for new targets finds room by
forgetting idle ones (or waits on disk when none can go), a degraded target forgotten
early keeps its health aside within the same bound, and a target whose robots.txt is
unreachable holds no rest (so no slot) once it has no work left. A real session (no
broker: its Kafka calls are not reached), real stores in a temporary dir."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from consumers.fetch import target_policy
from consumers.fetch.classify import Signal
from consumers.fetch.outcomes import Result
from consumers.fetch.robots import UNREACHABLE_RETRY_S
from consumers.fetch.seen import DONE
from consumers.fetch.stage import _Session
from tests.unit.fetch_session import run_session
from tests.unit.test_target_memory import RobotsFetcher

BOUND = 100
T = TypeVar("T")


class _Msg:
    """A frontier record as the session reads it."""

    def __init__(self, topic: str, offset: int, value: bytes, headers: Any) -> None:
        self._topic, self._offset, self._value, self._headers = topic, offset, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def headers(self) -> Any:
        return self._headers

    def error(self) -> None:
        return None


def _session_run(tmp_path: Path, body: Callable[[_Session], Awaitable[T]],
                 **overrides: Any) -> T:
    return run_session(tmp_path, body, max_target_state=BOUND, **overrides)


class _Jobs:
    """Frontier records for hosts ``h{n}.mint.test``, at increasing offsets."""

    def __init__(self) -> None:
        self.offset = 0

    def msgs(self, session: _Session, hosts: range) -> list[Any]:
        out = []
        for n in hosts:
            job = {"url": f"http://h{n}.mint.test/", "profile": "default",
                   "target": f"h{n}.mint.test", "depth": 1, "attempt": 0, "priority": 0,
                   "parent_url": None, "last_error": None, "delay_ms": 0, "meta": {}}
            rec = session.enc.job(session.topo.frontier, job)
            out.append(_Msg(session.topo.frontier, self.offset, rec.value, rec.headers))
            self.offset += 1
        return out


def _release_all(session: _Session) -> list[str]:
    """Start and finish every queued job (their targets become idle after one interval)."""
    now = time.monotonic()
    done = [target for target, _ in session.sched.pop_ready(now, 10_000)]
    for target in done:
        session.sched.done(target, now)
    time.sleep(0.01)  # past every interval (1 ms): forgetting them loosens no cap
    return done


def test_a_batch_of_new_targets_never_overshoots_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target_policy, "ROOM_RETRY_S", 0.0)
    jobs = _Jobs()

    async def body(session: _Session) -> dict[str, int]:
        # 300 new targets in one batch, none idle: a hundred get state, the rest wait on disk
        session.intake.admit(jobs.msgs(session, range(300)))
        assert session.policy.memory_counts()["target_slots"] == BOUND
        assert session.status.counters.get("parked") == 200
        # once those are idle, a new batch makes room by forgetting the longest idle
        _release_all(session)
        session.intake.admit(jobs.msgs(session, range(300, 350)))
        counts = session.policy.memory_counts()
        assert session.status.counters.get("parked") == 200  # all 50 found room
        assert session.status.counters.get("targets_forgotten", 0) >= 50
        return counts

    counts = _session_run(tmp_path, body)
    assert counts["target_slots"] <= BOUND
    assert counts["target_slots_peak"] == BOUND  # at insertion, not after a sweep


def test_degraded_targets_forgotten_early_keep_their_health_within_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target_policy, "ROOM_RETRY_S", 0.0)
    jobs = _Jobs()
    error = Result([], (DONE, 0), Signal.ERROR)

    async def body(session: _Session) -> tuple[dict[str, int], object, object]:
        for start in range(0, 400, 50):  # 400 targets, every other one degraded by an error
            session.intake.admit(jobs.msgs(session, range(start, start + 50)))
            for target in _release_all(session):
                if int(target[1:].split(".")[0]) % 2 == 0:
                    session.dispatch.observe(target, error)
            counts = session.policy.memory_counts()
            assert counts["target_health"] <= BOUND, counts
        # forgotten early, so resting aside; seen again, it gets its slowdown back
        again = next(reversed(session.policy.resting_health))  # the newest resting
        kept = session.policy.resting_health[again][1]
        assert again not in session.sched and session.policy.health_of(again) is None
        session.intake.admit([_job(session, jobs.offset, f"http://{again}/again", again)])
        return session.policy.memory_counts(), kept, session.policy.health_of(again)

    counts, kept, back = _session_run(tmp_path, body)
    assert counts["target_health_peak"] <= BOUND, counts
    assert counts["target_slots_peak"] <= BOUND, counts
    assert back is kept and getattr(kept, "degraded", False)


def _job(session: _Session, offset: int, url: str, target: str) -> Any:
    job = {"url": url, "profile": "default", "target": target, "depth": 1, "attempt": 0,
           "priority": 0, "parent_url": None, "last_error": None, "delay_ms": 0, "meta": {}}
    rec = session.enc.job(session.topo.frontier, job)
    return _Msg(session.topo.frontier, offset, rec.value, rec.headers)


def test_an_unreachable_robots_txt_rests_a_target_only_while_it_has_work(
        tmp_path: Path) -> None:
    async def body(session: _Session) -> tuple[float, float, list[str]]:
        robots = RobotsFetcher(503, b"")  # unreachable: disallow all for now
        session.robots.fetcher = robots  # type: ignore[assignment]
        rests = []
        # a target with one job, then one with two (one queued behind the first)
        for offset, target, paths in ((0, "alone.test", ["/"]), (1, "busy.test", ["/", "/2"])):
            session.intake.admit([_job(session, offset + n, f"http://{target}{p}", target)
                            for n, p in enumerate(paths)])
            await session.robots.rules_for(f"http://{target}/", target)  # unreachable now
            ((released, pj),) = session.sched.pop_ready(time.monotonic(), 10)
            assert released == target
            session.dispatch.running += 1
            await session.dispatch.fetch(pj)  # robots_unreachable: dead-lettered (one attempt)
            rests.append(session.sched.deferred_for(target, time.monotonic()))
        return rests[0], rests[1], robots.asked

    alone, with_work, asked = _session_run(tmp_path, body, max_attempts=1)
    assert alone < 1.0  # nothing left to wait: no rest, so the target can be forgotten
    assert with_work > UNREACHABLE_RETRY_S - 5  # its other job waits out the retry time
    assert len(asked) == 2  # one robots.txt request per origin, cached for the rest
