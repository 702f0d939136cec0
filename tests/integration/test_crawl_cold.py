"""A one-off crawl on a machine whose local broker is stopped starts it, and starts its
workers while the broker comes up (they wait for it), so the first request is not a broker
start plus a fleet start away."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from chaos.cluster import pick_base_port
from core.config import Settings
from crawlfleet.crawl import Plan, run_crawl
from infra import kafka_local
from infra.store_query import run_query
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite

pytestmark = pytest.mark.integration


def test_a_crawl_starts_the_stopped_local_broker_and_its_workers_meanwhile(
        settings: Settings, site_port: int, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "home"
    home = root / "kafka"
    monkeypatch.setenv(kafka_local.JARS_ENV, str(kafka_local.ensure_jars()))
    # A machine's own broker, made once and stopped (on a port of its own, not the suite's).
    kafka_local.up(base_dir=home, base_port=pick_base_port(1, 28400))
    kafka_local.down(home)
    monkeypatch.setenv("CRAWLFLEET_HOME", str(root))
    spec = bench_spec(site_port, pages=40, hosts=2, page_bytes=2000)
    cold = settings.replace(bootstrap_servers="", topic_prefix="", partitions=0)
    out = io.StringIO()
    try:
        with DemoSite(spec):
            summary = run_crawl(cold, spec.seeds(), Plan(), console=Console(file=out),
                                timeout_s=180)
        assert kafka_local.status(home).running, "the crawl leaves the broker it started up"
    finally:
        kafka_local.down(home)

    assert "the local broker is not running: starting it" in out.getvalue()
    assert summary.drained
    _, rows = run_query(settings, "SELECT url, status FROM pages FINAL")
    assert {str(u): int(s) for u, s in rows} == spec.expected(same_target_only=True)
    assert summary.pages_stored == len(rows)
    ph = summary.phases
    # The workers were started before the broker answered, the topics made once it did.
    assert ph["workers_started"] < ph["broker"] <= ph["topics"] <= ph["published"], ph
