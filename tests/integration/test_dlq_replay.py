"""Dead-letter replay on the real broker: each replayed URL is fetched once and stored once,
however often the same selection is replayed, through the normal fetch path."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from core.config import Settings
from core.urls import canonicalize
from crawlfleet import dlq
from sites.scripted_site import ScriptedSite, page, status
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    query,
    wait_drained,
    wait_until,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.2"
PATHS = [f"/p/{i}.html" for i in range(4)]


def _dead(s: Settings) -> int:
    return int(query(s, "SELECT count() FROM dead_letters FINAL")[0][0])


def test_replay_twice_fetches_each_dead_url_once(settings: Settings, site_port: int,
                                                  fleet: Callable[[Settings], Workers]) -> None:
    s = settings.replace(max_attempts=2, rate_cap=20.0)
    create_all_topics(s)
    ws = fleet(s)
    with ScriptedSite(HOST, site_port) as site:
        for p in PATHS:
            site.set(p, status(503))  # every attempt fails: dead after max_attempts
        site.set("/ok.html", page())
        urls = [canonicalize(site.url(p)) for p in PATHS]
        ws.start_pipeline()
        publish_seeds(s, [*urls, site.url("/ok.html")])
        wait_until(lambda: _dead(s) >= len(PATHS), 90, "the 503 pages to be dead-lettered")
        wait_drained(s, ws, 60, lambda: page_counts(s).final >= 1)
        assert [site.count(p) for p in PATHS] == [2] * len(PATHS)

        cols, rows = dlq.list_dead(s, dlq.Filters(reason="http_503"))
        assert sorted(r[cols.index("url")] for r in rows) == sorted(urls)
        record = dlq.show(s, rows[0][cols.index("event_id")])
        assert record["job"]["url"] == rows[0][cols.index("url")] and record["attempts"] == 2
        assert record["version_tuple"] is not None
        assert record["version_tuple"]["fetcher_version"].startswith("crawlfleet-fetch/")
        dry, report = dlq.replay(s, dlq.Filters(target=HOST), dry_run=True)
        assert report is None and len(dry.jobs) == len(PATHS)
        assert sum(site.count(p) for p in PATHS) == 2 * len(PATHS)  # a dry run sends nothing

        for p in PATHS:
            site.set(p, page(title=p))  # the site is healthy again
        first, _ = dlq.replay(s, dlq.Filters())
        again, _ = dlq.replay(s, dlq.Filters())  # while the first is still in flight
        assert first.jobs == again.jobs and len(first.jobs) == len(PATHS)
        wait_drained(s, ws, 90, lambda: page_counts(s).final >= len(PATHS) + 1)
        later, _ = dlq.replay(s, dlq.Filters(since_s=3600))  # and once more after it drained
        assert later.jobs == first.jobs
        wait_drained(s, ws, 60)

        assert [site.count(p) for p in PATHS] == [3] * len(PATHS)  # 2 failures + 1 replay
        assert site.count("/ok.html") == 1
        counts = page_counts(s)
        assert counts.final == counts.keys == len(PATHS) + 1
        stored = dict(query(s, "SELECT url, status FROM pages FINAL"))
        assert all(stored[u] == 200 for u in urls)
        assert _dead(s) == len(PATHS)  # no new dead letters
        replays = query(s, "SELECT count() FROM lineage FINAL WHERE stage = 'replay'")[0][0]
        assert int(replays) == 3 * len(PATHS)  # every replay is recorded, once per publish
        fetch = ws.all["fetch-0"]
        assert fetch.counter("skipped_seen") >= 2 * len(PATHS)  # the repeats, suppressed
