"""Dashboards that tell the truth, on crawled data in the real engine: every view and every
Grafana panel query (macros expanded) runs, blocked and 404 answers are never successes, and
queue depth over time is stored by the store worker's sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    wait_drained,
    wait_until,
)

from core.config import Settings
from crawlfleet.crawl import settings_env
from infra.store_query import run_query
from infra.views import GRAFANA_JSON, expand, load_views
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

OK, NOT_FOUND, BLOCKED, FLAKY = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
N = 10
#: A blocking site is deferred for longer and longer after 3 blocks in a row (2 s, 4 s, ...,
#: 64 s before the 9th request): a few pages keep the test short.
NB = 3


def _rows(s: Settings, sql: str) -> list[dict[str, Any]]:
    cols, rows = run_query(s, sql)
    return [dict(zip(cols, r, strict=True)) for r in rows]


def test_views_and_grafana_panels_on_a_crawl(settings: Settings,
                                             fleet: Callable[[Settings], Workers]) -> None:
    s = settings.replace(rate_cap=20.0, sample_interval_s=1.0)
    port = free_port((OK, NOT_FOUND, BLOCKED, FLAKY), 18880)
    hosts = {OK: Behaviour(), NOT_FOUND: Behaviour(status=404),
             BLOCKED: Behaviour(status=403), FLAKY: Behaviour(flaky_every=2)}
    with BehaviourSite(port, hosts) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        publish_seeds(s, [u for h in hosts for u in site.urls(h, NB if h == BLOCKED else N)])
        wait_drained(s, ws, 120, lambda: page_counts(s).final >= 3 * N + NB)
        wait_until(lambda: _rows(s, "SELECT uniqExact(ts) AS n FROM queue_samples")[0]["n"]
                   >= 3, 30, "a few queue samples")
        views = load_views()
        got = {name: _rows(s, expand(v.sql, 3600)) for name, v in views.items()}
        cli = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "sql", "--view",
                              "target_health", "--since", "1h", "--format", "json"],
                             env={**{k: v for k, v in os.environ.items()
                                     if not k.startswith("CRAWLFLEET_")}, **settings_env(s)},
                             capture_output=True, text=True, timeout=120)

    health = {r["target"].split(":")[0]: r for r in got["target_health"]}
    assert health[OK]["ok"] == N and health[OK]["blocked"] == 0
    assert health[BLOCKED]["blocked"] == NB and health[BLOCKED]["ok"] == 0  # never a success
    assert health[BLOCKED]["block_rate"] == 1.0
    assert health[NOT_FOUND]["not_found"] == N and health[NOT_FOUND]["ok"] == 0
    assert health[FLAKY]["ok"] == N and health[FLAKY]["retries"] >= N // 2 - 1
    assert 0 < health[FLAKY]["retry_rate"] < 1
    good = got["good_pages"]
    assert sum(r["good_pages"] for r in good) == 2 * N  # the 404s and 403s are not good pages
    assert sum(r["pages"] for r in good) == 3 * N + NB
    every = {"fetch", "parse", "store", "retry", "revisit"}
    assert {r["stage"] for r in got["queue_depth"]} == every
    assert {r["stage"] for r in got["oldest_task_age"]} == every
    assert any(r["records_per_s"] > 0 for r in got["throughput"] if r["stage"] == "fetch")
    (worker,) = got["worker_success"]
    assert worker["requests"] == sum(r["requests"] for r in health.values())
    assert worker["success_rate"] == round(2 * N / worker["requests"], 4)
    assert sum(r["ok"] for r in got["version_success"]) == 2 * N
    (version,) = got["version_success"]  # one fetch worker: one tuple, every failure its own
    assert version["share_of_failures"] == 1.0 and version["failed"] == worker["requests"] - 2 * N
    (paged,) = got["version_pages"]  # the pages carry the same tuple as the requests
    assert paged["version_tuple"] == version["version_tuple"] and paged["pages"] == 3 * N + NB

    # The shipped Grafana dashboard: one panel per view, the same query text, and each
    # panel's query runs (macros expanded as the data source plugin does).
    board = json.loads(GRAFANA_JSON.read_text())
    panels = {p["title"]: p["targets"][0]["rawSql"] for p in board["panels"]}
    assert panels == {v.title: v.sql for v in views.values()}
    for sql in panels.values():
        assert "$__" not in expand(sql, 3600, 60)
        run_query(s, expand(sql, 3600, 60))

    assert cli.returncode == 0, cli.stderr
    from_cli = {r["target"].split(":")[0]: r for r in json.loads(cli.stdout)}
    assert from_cli[BLOCKED]["blocked"] == NB and from_cli[NOT_FOUND]["not_found"] == N
