"""Readiness = joined, restored, consuming: the rule on a worker's own status, and the
``/ready`` answer the metrics server gives from it (no broker: a status built by hand)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.metrics import ready_app
from streams.readiness import readiness
from streams.status import StatusFile

JOINED: dict[str, Any] = {"waiting": "", "rebalances": 1, "gauges": {"restoring": 0},
                          "assignment": [["t.crawl.frontier", 0]]}


@pytest.mark.parametrize(("change", "reason"), [
    ({"waiting": "kafka at k1:9092 (3 s)"}, "waiting: kafka"),
    ({"waiting": "refused: fetcher 9.9 not approved", "gauges": {"refused": 1}}, "refused"),
    ({"rebalances": 0}, "not joined"),
    ({"gauges": {"restoring": 2}}, "restoring 2"),
    ({"gauges": {"restore_failing": 1, "restoring": 1}}, "restore_failing 1"),
    ({"gauges": {"recovering": 1}}, "recovering 1"),  # the quarantine app's table
])
def test_not_ready_until_joined_restored_and_consuming(change: dict[str, Any],
                                                       reason: str) -> None:
    verdict = readiness({**JOINED, **change})
    assert not verdict.ready and verdict.http_status == 503
    assert reason in verdict.reason


def test_ready_once_joined_and_restored_even_with_no_partition() -> None:
    assert readiness(JOINED).ready
    idle = readiness({**JOINED, "assignment": []})  # more members than partitions
    assert idle.ready and idle.http_status == 200 and "0 partitions" in idle.reason


def _get(app: Callable[..., Any], path: str) -> tuple[str, str]:
    seen: list[str] = []
    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET"},
                        lambda status, headers: seen.append(status)))
    return seen[0], body.decode()


def test_ready_endpoint_answers_from_the_live_status(tmp_path: Path) -> None:
    status = StatusFile(tmp_path, "fetch", "fetch-0")
    metrics: list[str] = []

    def exposition(env: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        metrics.append(env["PATH_INFO"])
        start("200 OK", [])
        return [b""]

    app = ready_app(status, exposition)
    code, body = _get(app, "/ready")
    assert code.startswith("503") and "not joined" in body
    status.gauges["restoring"] = 3
    status.assigned([("t.crawl.frontier", 0)])
    code, body = _get(app, "/ready")
    assert code.startswith("503") and "restoring 3" in body
    status.gauges["restoring"] = 0
    code, body = _get(app, "/ready/")
    assert code.startswith("200") and "consuming 1 partitions" in body
    _get(app, "/metrics")
    assert metrics == ["/metrics"]  # everything else is the Prometheus exposition
