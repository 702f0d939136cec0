"""A target's cap across a partition hand-over, on a real fetch session (no broker): once the
revoke callback returns, the new owner may send to the moved targets an interval after its
restore, so the old owner must send nothing more to them. A request task still waiting for
its send slot (here: an interval after this worker's own takeover) was left running by the
revoke and sent beside the new owner's first requests: two workers on one host, over its
cap (the rolling-restart test saw 4 requests in one second against cap + 1 = 3, once)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from consumers.fetch.stage import _Session
from streams.ledger import Pending
from tests.unit.fetch_session import run_session
from tests.unit.test_fetch_revoke import LibrdkafkaLikeConsumer, RecordingCommitter

T = "site.test"


class _Site:
    """robots.txt: 404 (all allowed), at once; a page: sent, never answered (in flight)."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str]] = []
        self.status, self.body = 404, b""

    async def get(self, url: str, *_: Any, **__: Any) -> object:
        self.sent.append((time.monotonic(), url))
        if url.endswith("/robots.txt"):
            return self
        await asyncio.Event().wait()
        raise AssertionError("never answered")


def _pj(session: _Session, n: int) -> Pending:
    job: Any = {"url": f"http://{T}/{n}", "profile": "default", "pinned": False,
                "target": T, "depth": 1, "attempt": 0, "priority": 0, "parent_url": None,
                "last_error": None, "delay_ms": 0, "meta": {}}
    tp = (session.topo.frontier, 0)
    pj = Pending(tp, n, session.ledger.epochs[tp], job, f"k{n}")
    session.ledger.admit(tp, n)
    session.ledger.hold(pj)
    return pj


def test_a_revoked_partitions_waiting_request_never_leaves_after_the_revoke(
        tmp_path: Path) -> None:
    async def body(session: _Session) -> tuple[list[tuple[float, str]], float, int, int]:
        site = _Site()
        d = session.dispatch
        d.fetcher = site  # type: ignore[assignment]
        session.robots.fetcher = site  # type: ignore[assignment]
        await session.robots.rules_for(f"http://{T}/", T)  # robots.txt known: pages go
        site.sent.clear()
        session._handover({0})  # taken over just now: its first request waits an interval
        session.targets.queue(T, _pj(session, 1), time.monotonic())
        loop = asyncio.create_task(d.dispatch_loop())
        await asyncio.sleep(0.1)
        waiting = d.running  # released, waiting for its send slot (0.5 s after the takeover)
        tp = session.topo.frontier
        session.kafka.consumer = LibrdkafkaLikeConsumer(tp, 0, 1)  # type: ignore[assignment]
        session.kafka.committer = RecordingCommitter()  # type: ignore[assignment]
        await session.kafka.call(session.kafka._on_revoke, session.kafka.consumer,
                                 [TopicPartition(tp, 0)])
        revoked_at, left = time.monotonic(), len(d.tasks)
        await asyncio.sleep(0.8)  # past the slot it waited for
        for task in (loop, *d.tasks):
            task.cancel()
        await asyncio.gather(loop, *d.tasks, return_exceptions=True)
        return site.sent, revoked_at, waiting, left

    sent, revoked_at, waiting, left = run_session(tmp_path, body, rate_cap=2.0)
    assert waiting == 1
    # No request left after the revoke returned: the new owner's alone from then on...
    assert [u for t, u in sent if t >= revoked_at] == [], sent
    # ...and the revoke returned only once the moved partition's request had ended.
    assert left == 0
