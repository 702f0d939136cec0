"""What waits on a quarantine says so (issue 41, point 5), on the real broker and store.

A site bans one profile (beta, by its User-Agent); pinned work for beta waits out the
quarantine (30 min by default: never sent as another identity). A one-off ``crawl`` shows
the held jobs and until when, and once they are all it waits on, ends them as dead letters
``quarantined`` and drains. A deployed fleet (workers with no crawl watching) keeps them
waiting, and ``top`` shows them. The site's own log referees what was asked.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from fleet_helpers import Workers, create_all_topics, query, store_ready, wait_until
from rich.console import Console

from core.config import Settings
from crawlfleet.crawl import Plan, run_crawl, settings_env
from infra.store_query import run_query
from producers.frontier import publish
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

BLOCKS = 2
BANS, FINE = "127.0.0.2", "127.0.0.3"


def _settings(settings: Settings) -> Settings:
    names = ("alpha", "beta", "gamma")
    return settings.replace(
        quarantine_blocks=BLOCKS, default_profile="alpha",  # quarantine_s: the default
        profiles={n: {"user_agent": f"{n}bot/1.0 (+https://example.org/{n})",
                      "region": "local"} for n in names})


def _seeds(site: BehaviourSite, beta: int, fine: int) -> tuple[list[str], list[str]]:
    """``beta`` URLs of the banning site pinned to beta, ``fine`` of the other, unpinned.
    (Unpinned work of the banning site would be held too: once a target refused an
    identity, no fresh one is tried there; that is the polite reading, tested elsewhere.)"""
    urls = site.urls(BANS, beta)
    return [json.dumps({"url": u, "profile": "beta"}) for u in urls] + site.urls(FINE, fine), urls


def _site(port: int) -> BehaviourSite:
    return BehaviourSite(free_port((BANS, FINE), port),
                         {BANS: Behaviour(block_agents=("betabot",)), FINE: Behaviour()})


def test_a_one_off_crawl_ends_quarantine_held_jobs_as_dead_letters_and_drains(
        settings: Settings) -> None:
    s = _settings(settings)
    with _site(19250) as site:
        lines, beta_urls = _seeds(site, beta=12, fine=6)
        out = io.StringIO()
        summary = run_crawl(s, lines, Plan(), console=Console(file=out, width=200),
                            timeout_s=150)
        asked = [r for r in list(site.seen) if r.agent == "betabot" and r.host == BANS
                 and r.path != "/robots.txt"]
    text = out.getvalue()
    assert summary.drained, text
    assert "jobs held by quarantines" in text and "until" in text, text
    assert "ending them as dead letters `quarantined`" in text, text
    # Beta asked N times (refused), then no more: the rest of its pinned work is held.
    assert BLOCKS <= len(asked) < len(beta_urls), asked
    assert {r.status for r in asked} == {403}
    _, dead = run_query(s, "SELECT url, reason, error FROM dead_letters FINAL WHERE reason = "
                           "'quarantined'")
    _, pages = run_query(s, "SELECT url FROM pages FINAL WHERE status = 403")
    refused = {str(u) for (u,) in pages}
    assert refused <= set(beta_urls)
    held = {str(u) for u, _, _ in dead}
    # Every beta URL ended once: refused (a 403 page) or held (a dead letter), never both,
    # and none was sent as another identity.
    assert held | refused == set(beta_urls) and not held & refused, (held, refused)
    assert len(held) == len(beta_urls) - len(asked)
    assert all("profile beta quarantined for" in str(e) and "until" in str(e)
               for _, _, e in dead), dead
    assert summary.dead_by_reason.get("quarantined") == len(held)
    _, ok = run_query(s, "SELECT count() FROM pages FINAL WHERE status = 200")
    assert int(ok[0][0]) == 6


def test_a_deployed_fleet_keeps_waiting_and_top_shows_the_held_jobs(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    s = _settings(settings)
    create_all_topics(s)
    ws = fleet(s)
    fetch = ws.start("fetch", "fetch-0")
    for stage in ("parse", "store", "quarantine"):
        ws.start(stage, f"{stage}-0")
    with _site(19260) as site:
        lines, beta_urls = _seeds(site, beta=8, fine=2)
        assert not publish(lines, s).errors
        wait_until(lambda: fetch.gauge("quarantine_held") > 0, 90,
                   f"the fetch worker to hold beta's work\n{ws.logs()}")
        asked = [r for r in list(site.seen) if r.agent == "betabot" and r.host == BANS
                 and r.path != "/robots.txt"]
        note = fetch.status().get("notes", {}).get("quarantine_held", {})
        assert set(note) == {BANS} and "until" in note[BANS], note
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")},
               **settings_env(s)}
        shown = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "top", "--once"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert "jobs held by quarantines" in shown.stdout, shown.stdout + shown.stderr
        wait_until(lambda: store_ready(s) and int(query(
            s, "SELECT count() FROM pages FINAL WHERE status = 200")[0][0]) >= 2, 60,
            "alpha's pages stored")
        # Still waiting: no job ended, nothing more asked as beta.
        assert fetch.gauge("quarantine_held") == len(beta_urls) - len(asked)
        assert int(query(s, "SELECT count() FROM dead_letters FINAL WHERE reason = "
                            "'quarantined'")[0][0]) == 0
        again = [r for r in list(site.seen) if r.agent == "betabot" and r.host == BANS
                 and r.path != "/robots.txt"]
        assert len(again) == len(asked)
