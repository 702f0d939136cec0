"""End to end on real parts: the demo site, a real broker, stage processes, chDB.

The site counts every request it gets, so politeness is checked where it matters: at the
server. The store is read back through the same query path users have.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from confluent_kafka.admin import AdminClient
from protego import Protego

from core.config import Settings
from crawlfleet.crawl import Plan, run_crawl
from infra.store_query import run_query
from infra.topics import topology_of
from infra.views import expand, load_views
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite
from sites.site_spec import USER_AGENT

pytestmark = pytest.mark.integration


def test_crawl_stores_exactly_the_reachable_allowed_pages(settings: Settings,
                                                          site_port: int) -> None:
    """A one-off crawl, as README's command runs it: its own topics, sized and removed."""
    spec = demo_spec(site_port)
    expected = spec.expected()
    one_off = settings.replace(topic_prefix="", partitions=0)
    with DemoSite(spec) as site:
        summary = run_crawl(one_off, spec.seeds(), Plan(), timeout_s=240)
        requests, _ = site.snapshot()

    assert summary.drained, "the crawl should drain by itself"
    # Its own topics: sized to the processes it ran, deleted once drained.
    own = {s.name for s in topology_of(settings.replace(topic_prefix=summary.topic_prefix))
           .specs()}
    assert summary.partitions == Plan().partitions()
    assert summary.topics_deleted == len(own)
    assert not own & set(AdminClient(settings.kafka_common()).list_topics(timeout=10).topics)
    _, rows = run_query(settings, "SELECT url, status FROM pages FINAL")
    stored = {str(u): int(s) for u, s in rows}
    assert stored == expected

    # Every page exactly once: FINAL collapses, and there was nothing to collapse in keys.
    _, counts = run_query(settings, "SELECT count(), uniqExact(url), uniqExact(dedupe_key) "
                                    "FROM pages FINAL")
    assert counts[0][0] == counts[0][1] == counts[0][2] == len(expected)

    # No disallowed URL was requested: judged by the site's own request counter.
    rules = {h: Protego.parse(spec.robots_txt(h) or "") for h in spec.hosts}
    for url in requests:
        host = urlsplit(url).hostname or ""
        if urlsplit(url).path == "/robots.txt":
            continue
        assert rules[host].can_fetch(url, USER_AGENT), f"requested disallowed {url}"

    # robots.txt fetched once per host, and no page fetched twice except the flaky retries.
    for host in spec.hosts:
        assert requests[spec.url(host, "/robots.txt")] == 1
    repeated = {u: n for u, n in requests.items() if n > 1}
    assert all("flaky" in u for u in repeated), repeated
    assert any(n == 3 for n in repeated.values()), "flaky page: two 503s then 200"

    # Failures are visible: the robots-disallowed links are dead letters with their reason,
    # the 503s are retry events in telemetry.
    _, dead = run_query(settings, "SELECT reason, count() FROM dead_letters FINAL "
                                  "GROUP BY reason")
    assert dict((str(r), int(n)) for r, n in dead).get("robots_disallowed", 0) >= 1
    _, retries = run_query(settings, "SELECT count() FROM fetch_events FINAL "
                                     "WHERE outcome = 'retry' AND reason = 'http_503'")
    assert retries[0][0] == 2
    assert summary.pages_stored == len(expected)
    # Every page but the seeds was found as a link: each is one hop, after its parent.
    _, seeds = run_query(settings, "SELECT count() FROM pages FINAL WHERE depth = 0")
    assert summary.hop_ms["n"] == len(expected) - int(seeds[0][0]), summary.hop_ms
    assert 0 < summary.hop_ms["p50"] <= summary.hop_ms["p99"]
    # The phases of its time, in order from the command's start.
    ph = summary.phases
    # Its partition count is set: the workers start while the topics are made.
    assert ph["workers_started"] <= ph["topics"] <= ph["published"] <= ph["drained"] \
        <= ph["stopped"] <= ph["ended"], ph
    assert ph["first_fetch"] <= ph["last_store"] <= ph["drained"], ph

    # The dashboards after it tell the truth (a crawl shorter than a few sample intervals):
    # the queues end drained, and the throughput view shows the fetching that happened.
    views = load_views()
    cols, rows = run_query(settings, expand(views["queue_depth"].sql, 3600))
    last: dict[str, int] = {}
    for r in (dict(zip(cols, row, strict=True)) for row in rows):  # ordered by time
        last[str(r["stage"])] = int(r["lag"])
    assert last == {"fetch": 0, "parse": 0, "store": 0, "retry": 0, "revisit": 0}, rows
    cols, rows = run_query(settings, expand(views["throughput"].sql, 3600))
    fetch_rates = [float(r[2]) for r in rows if r[1] == "fetch"]
    assert fetch_rates and max(fetch_rates) > 0, rows
