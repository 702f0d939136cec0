"""Scrape a live fetch worker's /metrics and check it against the site's own request log.

A loopback site answers 200, 404, 503-then-200 and always-500 pages, and its robots.txt
disallows /private/. After the crawl drained, the worker's request counters by outcome and
status class equal what the site served, and its dead letters by reason equal the store's
``dead_letters`` table.
"""

from __future__ import annotations

import collections
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fleet_helpers import (
    Workers,
    create_all_topics,
    publish_seeds,
    query,
    report,
    wait_drained,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families

from core.config import Settings
from sites.loop_site import LoopSite

pytestmark = pytest.mark.integration

N = {"ok": 10, "missing": 5, "flaky": 3, "gone": 2, "private": 5}
#: Every failing page on a host of its own: errors in a row rest a target for longer and
#: longer (2 s, 4 s, 8 s ...), which would only make the test slow.
HOSTS = {"ok": ["127.0.0.2"], "missing": ["127.0.0.2"], "private": ["127.0.0.2"],
         "flaky": ["127.0.0.3", "127.0.0.4", "127.0.0.5"], "gone": ["127.0.0.6", "127.0.0.7"]}


class OutcomeSite(LoopSite):
    """Answers by path: /ok 200, /missing 404, /flaky 503 once then 200, /gone 500."""

    def __init__(self, port: int) -> None:
        super().__init__(tuple(sorted({h for hs in HOSTS.values() for h in hs})), port,
                         "outcome-site")
        self.served: list[tuple[str, int]] = []  # (path, status) of every page request

    def urls(self) -> list[str]:
        return [f"http://{HOSTS[kind][i % len(HOSTS[kind])]}:{self.port}/{kind}/{i}.html"
                for kind, n in N.items() for i in range(n)]

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        path = request.raw_path
        if path == "/robots.txt":
            return web.Response(text="User-agent: *\nDisallow: /private/\n")
        kind = path.split("/")[1]
        with self._lock:
            again = any(p == path for p, _ in self.served)
            status = {"ok": 200, "missing": 404, "gone": 500,
                      "flaky": 200 if again else 503}.get(kind, 200)
            self.served.append((path, status))
        if status != 200:
            return web.Response(status=status, text="no")
        return web.Response(text=f"<html><title>{path}</title></html>", content_type="text/html")


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def by(samples: list[tuple[dict[str, str], float]], *labels: str) -> dict[Any, int]:
    out: collections.Counter[Any] = collections.Counter()
    for lb, v in samples:
        out[tuple(lb[k] for k in labels) if len(labels) > 1 else lb[labels[0]]] += int(v)
    return {k: v for k, v in out.items() if v}


def test_scraped_counters_match_the_site(settings: Settings, site_port: int,
                                         fleet: Callable[[Settings], Workers]) -> None:
    with OutcomeSite(site_port) as site:
        create_all_topics(settings)
        w = fleet(settings)
        w.start_pipeline(fetch_0={"CRAWLFLEET_METRICS_PORT": "0"})
        fetch = w.all["fetch-0"]
        port = wait_until(lambda: fetch.status().get("metrics_port"), 60, "the metrics port")
        publish_seeds(settings, site.urls())
        want_pages = N["ok"] + N["missing"] + N["flaky"]
        want_dead = N["gone"] + N["private"]

        def done() -> bool:
            pages = query(settings, "SELECT count() FROM pages_v")[0][0]
            dead = query(settings, "SELECT count() FROM dead_letters_v")[0][0]
            return int(pages) == want_pages and int(dead) == want_dead

        wait_drained(settings, w, timeout=180, ready=done)
        m = scrape(int(port))
        table = {str(r): int(n) for r, n in query(
            settings, "SELECT reason, count() FROM dead_letters_v GROUP BY reason")}
        served = list(site.served)

    requests = m["crawlfleet_fetch_requests_total"]
    by_class = by(requests, "status_class")
    site_by_class = collections.Counter(f"{s // 100}xx" for _, s in served)
    assert by_class == dict(site_by_class), (by_class, site_by_class)
    by_outcome = by(requests, "outcome", "status_class")
    assert by_outcome == {("ok", "2xx"): N["ok"] + N["flaky"], ("ok", "4xx"): N["missing"],
                          ("retry", "5xx"): N["flaky"] + 2 * N["gone"],
                          ("dead", "5xx"): N["gone"]}, by_outcome
    assert sum(by_outcome.values()) == len(served)
    assert not any(p.startswith("/private/") for p, _ in served)

    dead = by(m["crawlfleet_dead_letters_total"], "reason")
    assert dead == table == {"robots_disallowed": N["private"], "http_500": N["gone"]}, \
        (dead, table)

    labels = requests[0][0]
    info = m["crawlfleet_build_info"][0][0]
    assert labels["stage"] == "fetch" and labels["worker"] == "fetch-0"
    assert labels["code_revision"] == info["code_revision"]
    # code_revision unset: the worker reports the commit it runs from (git's own answer)
    head = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert info["code_revision"].removesuffix("+dirty") == head[:12]
    durations = by(m["crawlfleet_fetch_request_duration_seconds_count"], "outcome")
    assert sum(durations.values()) == len(served)
    committed = by(m["crawlfleet_transactions_total"], "result")["committed"]
    assigned = by(m["crawlfleet_rebalance_partitions_total"], "change")["assigned"]
    assert committed >= 1 and assigned >= settings.topic_partitions
    assert sum(v for _, v in m["crawlfleet_restore_duration_seconds_count"]) >= 1
    assert sum(v for _, v in m["crawlfleet_inflight_requests"]) == 0
    report("metrics_scrape", requests=by_outcome, site=dict(site_by_class), dead=dead,
           store_dead=table, committed_txns=committed, assigned_partitions=assigned)
