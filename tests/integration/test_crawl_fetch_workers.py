"""A one-off crawl with several fetch workers publishes its seeds once they all hold their
partitions: no target changes hands mid-crawl (each move is a pause of that target)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from core.config import Settings
from crawlfleet.crawl import Plan, run_crawl
from infra.store_query import run_query
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite

pytestmark = pytest.mark.integration


def test_each_target_is_fetched_by_one_worker_when_several_start_together(
        settings: Settings, site_port: int) -> None:
    # The default cap: the crawl lasts seconds, long enough for a late join to move targets.
    s = settings.replace(rate_cap=2.0)
    spec = bench_spec(site_port, pages=40, hosts=4, page_bytes=2000)
    with DemoSite(spec):
        summary = run_crawl(s, spec.seeds(), Plan(fetch_workers=2),
                            console=Console(file=io.StringIO()), timeout_s=180)
    assert summary.drained
    _, rows = run_query(s, "SELECT url, status FROM pages FINAL")
    assert {str(u): int(st) for u, st in rows} == spec.expected(same_target_only=True)
    _, per_target = run_query(s, "SELECT target, groupUniqArray(fetch_worker) FROM pages "
                                 "FINAL GROUP BY target ORDER BY target")
    assert len(per_target) == 4
    # No target was fetched by two workers (it would have moved between them).
    assert all(len(ws) == 1 for _, ws in per_target), per_target
    ph = summary.phases
    assert ph["fetch_stable"] <= ph["published"], ph
