"""A real fetch session for unit tests: no broker (its Kafka calls are not reached), real
stores in a temporary dir, one frontier partition assigned; closed whatever the body does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from consumers.fetch.stage import FetchStage, _Session
from core.config import Settings

T = TypeVar("T")


def run_session(tmp_path: Path, body: Callable[[_Session], Awaitable[T]],
                **settings: Any) -> T:
    """Run ``body`` on a session of a fetch stage made with ``settings`` (a fast cap)."""
    s = Settings(**{"data_dir": tmp_path, "bootstrap_servers": "127.0.0.1:1",
                    "partitions": 1, "rate_cap": 1000.0, **settings})
    stage = FetchStage(s, worker_id="fetch-test")

    async def scenario() -> T:
        session = _Session(stage)
        session.ledger.assign([(session.topo.frontier, 0)], {(session.topo.frontier, 0): 0})
        try:
            return await body(session)
        finally:
            session.seen.close()
            session.parked.store.close()
            session.kafka.kx.shutdown(wait=False)

    return asyncio.run(scenario())
