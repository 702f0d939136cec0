"""Pause and resume through crawl.control, judged by the requests the site receives."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import pytest
from rich.console import Console

from core.config import Settings
from crawlfleet.crawl import Plan, Summary, run_crawl
from infra.store_query import run_query
from producers import control
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite

pytestmark = pytest.mark.integration


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _crawl_in_thread(settings: Settings, seeds: list[str]) -> tuple[threading.Thread,
                                                                     list[Summary]]:
    out: list[Summary] = []
    t = threading.Thread(target=lambda: out.append(run_crawl(
        settings, seeds, Plan(fetch_workers=2), console=Console(file=io.StringIO()),
        timeout_s=240)), daemon=True)
    t.start()
    return t, out


def _page_hits(site: DemoSite, host: str | None = None) -> int:
    requests, _ = site.snapshot()
    return sum(n for u, n in requests.items() if not u.endswith("/robots.txt")
               and (host is None or f"//{host}:" in u))


def test_global_pause_stops_every_fetch_worker_and_resume_finishes(settings: Settings,
                                                                   site_port: int) -> None:
    spec = bench_spec(site_port, pages=240, hosts=3, page_bytes=2000)
    s = settings.replace(rate_cap=15.0, scope="seeds")
    with DemoSite(spec) as site:
        thread, out = _crawl_in_thread(s, spec.seeds())
        _wait(lambda: _page_hits(site) >= 20, 60, "the crawl to start")
        control.pause(s)
        time.sleep(2.0)  # the promise: every worker stops dequeuing within 2 s
        frozen = _page_hits(site)
        time.sleep(3.0)
        assert _page_hits(site) == frozen, "a paused fleet kept sending requests"
        assert frozen < len(spec.expected()), "the crawl finished before the pause took hold"
        control.resume(s)
        thread.join(240)
    assert out and out[0].drained
    _, rows = run_query(s, "SELECT count(), uniqExact(url) FROM pages FINAL")
    assert rows[0][0] == rows[0][1] == len(spec.expected())  # nothing in flight was lost


def test_target_pause_holds_only_that_target(settings: Settings, site_port: int) -> None:
    spec = bench_spec(site_port, pages=240, hosts=3, page_bytes=2000)
    s = settings.replace(rate_cap=10.0, scope="seeds")
    held = spec.hosts[0]
    with DemoSite(spec) as site:
        thread, out = _crawl_in_thread(s, spec.seeds())
        _wait(lambda: _page_hits(site, held) >= 5, 60, "the crawl to reach the target")
        control.pause(s, held)
        time.sleep(2.0)
        frozen, others = _page_hits(site, held), _page_hits(site) - _page_hits(site, held)
        time.sleep(3.0)
        assert _page_hits(site, held) == frozen, "a paused target kept getting requests"
        assert _page_hits(site) - _page_hits(site, held) > others + 10, \
            "the other targets should keep flowing"
        control.resume(s, held)
        thread.join(240)
    assert out and out[0].drained
    _, rows = run_query(s, "SELECT count(), uniqExact(url) FROM pages FINAL")
    assert rows[0][0] == rows[0][1] == len(spec.expected())


def test_jobs_outside_a_crawl_window_wait_and_are_not_dropped(settings: Settings,
                                                              site_port: int) -> None:
    from datetime import UTC, datetime, timedelta

    from crawlfleet.crawl import Fleet
    from infra.topics import create_topics
    from producers.frontier import publish
    from streams.status import read_statuses

    spec = bench_spec(site_port, pages=90, hosts=3, page_bytes=1500)
    closed = spec.hosts[0]
    opens = datetime.now(UTC) + timedelta(hours=2)
    window = f"UTC {opens:%H:%M}-{opens + timedelta(hours=1):%H:%M}"
    s = settings.replace(rate_cap=20.0, scope="seeds", allowed_targets=spec.hosts,
                         crawl_windows={closed: window})
    create_topics(s)
    others = {u for u in spec.expected() if f"//{closed}:" not in u}
    with DemoSite(spec) as site:
        fleet = Fleet(s, Plan(), s.data_dir / "logs")
        fleet.start()
        try:
            publish(spec.seeds(), s)
            _wait(lambda: sum(1 for u in site.snapshot()[0] if u in others) == len(others),
                  120, "the open targets to be crawled")
            time.sleep(1.0)
            assert _page_hits(site, closed) == 0, "a target outside its window was fetched"
            statuses = read_statuses(s.status_dir)
            assert sum(st["counters"].get("outside_window", 0) for st in statuses) >= 1
            # The waiting jobs were parked on disk, not dropped: none dead-lettered, and the
            # fetch worker holds them in its parked queue (not in memory, not in flight).
            _, dead = run_query(s, "SELECT count() FROM dead_letters FINAL "
                                   f"WHERE target = '{closed}'")
            assert dead[0][0] == 0
            fetch = [st for st in statuses if st["stage"] == "fetch"]
            assert sum(st["gauges"].get("parked", 0) for st in fetch) >= 1
            assert sum(st["gauges"].get("inflight", 0) for st in fetch) == 0
        finally:
            fleet.stop(10)


def test_link_discovery_pauses_when_the_frontier_is_over_its_bound(settings: Settings,
                                                                   site_port: int) -> None:
    from crawlfleet.crawl import Fleet
    from infra.lag import LagProbe
    from infra.topics import create_topics
    from producers.frontier import publish

    bound = 60
    spec = bench_spec(site_port, pages=400, hosts=3, page_bytes=1500, links_per_page=10)
    s = settings.replace(rate_cap=6.0, scope="seeds", allowed_targets=spec.hosts,
                         frontier_lag_bound=bound)
    create_topics(s)
    probe = LagProbe(s)
    samples: list[int] = []
    with DemoSite(spec):
        fleet = Fleet(s, Plan(), s.data_dir / "logs")
        fleet.start()
        try:
            publish(spec.seeds(), s)
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline:  # discovery (10 links/page) outpaces 18 pages/s
                samples.append(probe.lag(f"{s.topic_prefix}crawlfleet-fetch",
                                         [f"{s.topic_prefix}crawl.frontier",
                                          f"{s.topic_prefix}crawl.frontier.high"],
                                         s.topic_partitions))
                time.sleep(0.25)
            from streams.status import read_statuses
            holds = sum(st["counters"].get("backpressure_holds", 0)
                        for st in read_statuses(s.status_dir))
        finally:
            fleet.stop(10)
            probe.close()
    assert holds > 0, "discovery never had to wait: the test did not exercise the bound"
    # Lag is measured in offsets, and every transaction that writes links also writes a
    # commit marker to each partition it touched: markers can add up to a third on top,
    # plus one page's links between two measurements. Unbounded, lag here reaches the
    # thousands (400 pages x 10 links).
    assert max(samples) <= bound * 1.5 + 10, max(samples)
