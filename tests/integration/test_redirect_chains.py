"""Redirect hops count per chain, not per crawl tree: a site that redirects every link (a
trailing slash, as http→https would) is crawled to its full depth, past ``max_redirects``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from consumers.parse import link_meta
from core.config import Settings
from core.urls import canonicalize
from schemas.keys import REDIRECT_HOPS, REPLAY_META
from sites.scripted_site import ScriptedSite, page, redirect
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    query,
    wait_drained,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.4"
LEVELS = 9  # beyond the default max_redirects (5)


def test_links_do_not_inherit_the_redirect_hops_of_their_page() -> None:
    assert link_meta({REDIRECT_HOPS: "4", REPLAY_META: "r1", "campaign": "x"}) == \
        {"campaign": "x"}
    assert link_meta(None) == {}


def test_a_site_that_redirects_every_link_is_crawled_to_its_full_depth(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    s = settings.replace(rate_cap=20.0)
    assert s.max_redirects < LEVELS
    create_all_topics(s)
    ws = fleet(s)
    with ScriptedSite(HOST, site_port) as site:
        for n in range(LEVELS):
            nxt = [site.url(f"/p{n + 1}")] if n + 1 < LEVELS else []
            site.set(f"/p{n}", redirect(site.url(f"/p{n}/")))
            site.set(f"/p{n}/", page(*nxt))
        ws.start_pipeline()
        publish_seeds(s, [site.url("/p0")])
        # every level: its redirect answer (3xx) and its page (200)
        wait_drained(s, ws, 180, lambda: page_counts(s).final >= 2 * LEVELS)
        stored = {str(u): int(st) for u, st in query(
            s, "SELECT url, status FROM pages FINAL")}
    for n in range(LEVELS):
        assert stored.get(canonicalize(site.url(f"/p{n}/"))) == 200, (n, stored)
        assert stored.get(canonicalize(site.url(f"/p{n}"))) == 301, (n, stored)
