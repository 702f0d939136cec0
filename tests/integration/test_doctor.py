"""``crawlfleet doctor`` against a store with crawled data, through the running store worker.

The site answers each page after 0.4 s, so the measured p95 is at least that; a max poll
interval of 1 s is below three of them: the doctor must say so, with the fix, and exit 1.
With the defaults it finds nothing to fail. It also reads the broker's retention of the
dedupe state and compares it with what the settings need.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from fleet_helpers import Workers, create_all_topics, publish_seeds, query, wait_drained

from core.config import Settings
from crawlfleet.crawl import settings_env
from sites.behaviour_site import Behaviour, BehaviourSite

pytestmark = pytest.mark.integration

HOST = "127.0.0.2"
PAGES = 8


def doctor(settings: Settings, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **settings_env(settings), "COLUMNS": "250", **env}
    full.pop("CRAWLFLEET_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "crawlfleet.cli", "doctor"], env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def row(out: str, check: str) -> str:
    (line,) = [ln for ln in out.splitlines() if check in ln]
    return line


def test_doctor_sizes_leases_from_the_stores_durations(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    with BehaviourSite(site_port, {HOST: Behaviour(delay_s=0.4)}) as site:
        create_all_topics(settings)
        w = fleet(settings)
        w.start_pipeline()
        publish_seeds(settings, site.urls(HOST, PAGES))
        wait_drained(settings, w, timeout=120, ready=lambda: int(
            query(settings, "SELECT count() FROM pages_v")[0][0]) == PAGES)
        requests = len(site.pages(HOST))

        healthy = doctor(settings)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        durations = row(healthy.stdout, "fetch durations")
        assert f"{requests} requests" in durations, durations

        tight = doctor(settings, CRAWLFLEET_MAX_POLL_INTERVAL_MS="1")
    lease = "max_poll_interval_ms >= 3x longest gap between polls"
    measured = row(healthy.stdout, lease)
    assert "ok" in measured and all(f"{st} " in measured for st in ("fetch", "parse",
                                                                     "store", "retry"))
    assert tight.returncode == 1, tight.stdout + tight.stderr
    poll = row(tight.stdout, lease)
    assert "FAIL" in poll and "raise max_poll_interval_ms" in poll, poll
    assert "ok" in row(healthy.stdout, "crawl.seen retention.ms")


def test_doctor_reads_the_seen_topics_retention(settings: Settings) -> None:
    """The topic keeps dedupe keys 7 days (created so); settings that need longer are found."""
    create_all_topics(settings)
    longer = doctor(settings, CRAWLFLEET_SEEN_TTL_S=str(30 * 86400))
    assert "warn" in row(longer.stdout, "crawl.seen retention.ms"), longer.stdout
    # 199 retries of up to an hour: the dedupe horizon (8.3 days) outlives the topic's keys.
    horizon = doctor(settings, CRAWLFLEET_MAX_ATTEMPTS="200",
                     CRAWLFLEET_SEEN_TTL_S=str(10 * 86400))
    assert horizon.returncode == 1, horizon.stdout + horizon.stderr
    assert "FAIL" in row(horizon.stdout, "crawl.seen retention.ms"), horizon.stdout
