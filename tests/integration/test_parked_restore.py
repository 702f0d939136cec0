"""Parked queues survive a killed fetch worker: restored from ``crawl.parked``, nothing
lost, nothing stored twice (real broker, real worker processes, real chDB)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    report,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

LEASE_MS = 6000  # a short broker-judged lease keeps the test fast




@pytest.mark.parametrize("wipe_local", [False, True])
def test_parked_jobs_survive_a_killed_fetch_worker(settings: Settings, wipe_local: bool,
                                                   fleet: Callable[[Settings], Workers]) -> None:
    """Kill -9 the only fetch worker while most of a capped site's work is parked; its
    restart (with its local RocksDB intact, or wiped as on a new machine) restores the
    parked queue from the changelog and finishes the crawl: every page stored once."""
    host, n = "127.0.0.2", 400
    s = settings.replace(rate_cap=20.0, session_timeout_ms=LEASE_MS)
    port = free_port((host,), 18800)
    with BehaviourSite(port, {host: Behaviour()}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        urls = site.urls(host, n)
        publish_seeds(s, urls)
        fetch = ws.all["fetch-0"]
        wait_until(lambda: fetch.gauge("parked") >= 150 and len(site.pages(host)) >= 40, 60,
                   "jobs parked and the crawl under way")
        parked_before = fetch.gauge("parked")
        fetch.kill()
        if wipe_local:
            import shutil
            shutil.rmtree(s.data_dir / "parked", ignore_errors=True)
            shutil.rmtree(s.data_dir / "seen", ignore_errors=True)
        ws.restart("fetch-0")
        wait_drained(s, ws, 120, lambda: page_counts(s).final >= n)
        counts = page_counts(s)
        stored = stored_pages(s)
        restarted = ws.all["fetch-0"]
        unparked = restarted.counter("unparked")
    requests = collections.Counter(p for _, _, p in site.pages(host))
    assert counts.final == counts.urls == counts.keys == n, counts  # stored exactly once
    assert set(stored) == set(urls)
    assert all(v == 200 for v in stored.values())
    assert unparked > 0  # the restarted worker took jobs back from the restored queue
    # Only work in flight or done-but-uncommitted at the kill is asked twice.
    twice = sum(1 for c in requests.values() if c > 1)
    assert max(requests.values()) <= 2 and twice <= 60, twice
    report("parked_restore", wipe_local=wipe_local, parked_at_kill=parked_before,
           refetched=twice, unparked_after=unparked)
