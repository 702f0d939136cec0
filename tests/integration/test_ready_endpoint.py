"""A real worker's ``/ready`` answers 503 (with why) until it has joined its group and
restored its partitions' state, then 200 (real broker, a real fetch worker process).

The worker starts before its topics exist, so it waits (for its topics), then joins and
restores its seen and parked stores: the probe a rolling update follows must not say
"ready" before that, as the metrics page did.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from fleet_helpers import Workers, create_all_topics, wait_until

from core.config import Settings
from sites.demo_server import free_port

pytestmark = pytest.mark.integration


def _ready(port: int) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return None  # not serving yet (starting, or between the wait and the stage)


def test_ready_goes_from_503_to_200_once_the_worker_has_joined_and_restored(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    port = free_port(("127.0.0.1",), 19460)
    ws = fleet(settings)
    worker = ws.start("fetch", "fetch-0", env={"CRAWLFLEET_METRICS_PORT": str(port)})
    waiting = wait_until(lambda: _ready(port), 60, "the waiting worker's /ready")
    assert waiting[0] == 503, waiting  # its topics do not exist: it cannot have joined
    assert "waiting" in waiting[1] or "not joined" in waiting[1], waiting
    assert worker.status().get("rebalances", 0) == 0
    create_all_topics(settings)
    seen: list[tuple[int, str]] = []

    def answered_ready() -> bool:
        got = _ready(port)
        if got is not None:
            seen.append(got)
        return got is not None and got[0] == 200

    wait_until(answered_ready, 60, "/ready to answer 200", interval=0.1)
    status = worker.status()
    assert status["rebalances"] >= 1 and status["assignment"], status
    assert not status["gauges"].get("restoring"), status["gauges"]
    assert "joined, restored, consuming" in seen[-1][1]
    codes = [code for code, _ in seen]
    assert codes.index(200) == len(codes) - 1 or set(codes[codes.index(200):]) == {200}
    assert set(codes) <= {200, 503}
