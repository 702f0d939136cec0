"""Revisits on the real broker and store (issue 45): pages visited again on their
interval by the revisit stage's keyed timers, each visit fetched and stored once, a kill -9
of the timer owner while revisits are due firing each of them exactly once, new URLs
keeping their share of a target busy with due revisits, and the seen store keeping a
page's first and latest visits' keys only (the ones between pruned past the horizon).

Intervals are seconds here (``every 3s``): timers run on broker time, which a test cannot
speed up, so the cycles are short instead; the policies' arithmetic over long simulated
spans is ``tests/unit/test_revisit_policy.py``'s.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from core.config import Settings
from core.urls import canonicalize
from infra.store_query import run_query
from infra.topics import topology_of
from infra.views import expand, load_views
from schemas.codec import default_codec
from schemas.records import CrawlJob
from sites.changing_site import ChangingSite
from streams.status import holds_work
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    publish_seeds,
    query,
    read_topic,
    scalar,
    wait_until,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.7"
MODES = {"/e0": "etag", "/e1": "etag", "/m0": "last_modified", "/n0": "none",
         "/c0": "clock", "/c1": "clock"}


def _visits(s: Settings) -> dict[str, list[tuple[int, str]]]:
    """Each page's visits (number, outcome), in order; the raw rows, so a visit stored
    twice shows twice."""
    out: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for url, visit, outcome in query(s, "SELECT url, visit, outcome FROM page_visits "
                                        "ORDER BY url, visit"):
        out[str(url)].append((int(visit), str(outcome)))
    return out


def _at_least(s: Settings, urls: list[str], n: int) -> Callable[[], bool]:
    return lambda: all(len({v for v, _ in _visits(s).get(u, [])}) >= n for u in urls)


def test_pages_are_revisited_on_their_interval_once_per_visit_across_a_kill(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    s = settings.replace(revisit="every 3s")
    create_all_topics(s)
    ws = fleet(s)
    with ChangingSite(HOST, site_port) as site:
        urls = [canonicalize(site.add(path, mode)) for path, mode in MODES.items()]
        ws.start_pipeline()
        revisit = ws.start("revisit")
        publish_seeds(s, urls)
        wait_until(_at_least(s, urls, 1), 90, "every first visit stored")
        # The next visits are on the revisit worker's timers now: kill it before they are
        # due, then start it again; each must fire once, from the restored timers.
        wait_until(lambda: revisit.gauge("timers_planned") >= len(urls), 30,
                   "the next visits planned")
        # planned visits are not held work: a drain (crawl's, chaos's) does not wait on them
        assert not holds_work(revisit.status()["gauges"]), revisit.status()["gauges"]
        revisit.kill()
        site.change("/n0")  # its words change before its second visit
        ws.restart("revisit-0")
        wait_until(_at_least(s, urls, 3), 120, "three visits of every page")
        requests = {p: site.count(p) for p in MODES}
        visits = _visits(s)
        cols, rows = run_query(s, expand(load_views()["revisits"].sql, 3600))
        (view,) = [dict(zip(cols, r, strict=True)) for r in rows]
    for url in urls:
        numbers = [v for v, _ in visits[url]]
        # visits 0, 1, 2 ... each stored once, none skipped
        assert numbers == list(range(len(numbers))), (url, visits[url])
    for path, url in zip(MODES, urls, strict=True):
        # one request per visit made (a visit in flight at the end may add one)
        assert len(visits[url]) <= requests[path] <= len(visits[url]) + 1, (path, requests)
        outcomes = [o for _, o in visits[url]]
        assert outcomes[0] == "new"
        expected = {"etag": "not_modified", "last_modified": "not_modified",
                    "clock": "unchanged"}.get(MODES[path])
        if expected is not None:
            assert set(outcomes[1:]) == {expected}, (path, outcomes)
    n0 = [o for _, o in visits[urls[list(MODES).index("/n0")]]]
    assert n0[1] == "changed" and set(n0[2:]) <= {"unchanged"}, n0
    # The revisits view, read as the crawl goes on: every page's latest visit plans the next
    # (due now or not yet); at least two revisits of each done, by the outcomes above, none
    # before it was due (one host's clock: parse plans, the broker's timer fires later).
    assert view["due_now"] + view["planned"] == len(urls), view
    assert view["done"] == view["changed"] + view["unchanged"] + view["not_modified"], view
    assert view["done"] >= 2 * len(urls) and view["not_modified"] >= 2 * 3, view
    assert view["unchanged"] >= 2 * 2 + 1 and view["changed"] >= 1, view
    assert 0 <= view["late_p50_s"] <= view["late_max_s"], view


def test_a_revisit_is_a_job_like_any_other_robots_txt_included(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    """The site disallows the page after its first visit: the revisit asks robots.txt
    again (its rules expired) and is dead-lettered, never fetched; nothing follows it."""
    s = settings.replace(revisit="every 2s", robots_ttl_s=1.0)
    create_all_topics(s)
    ws = fleet(s)
    with ChangingSite(HOST, site_port) as site:
        url = canonicalize(site.add("/p", "etag"))
        ws.start_pipeline()
        ws.start("revisit")
        publish_seeds(s, [url])
        wait_until(lambda: _visits(s).get(url), 60, "the first visit stored")
        site.set("/robots.txt", (200, "User-agent: *\nDisallow: /p\n", {}))
        wait_until(lambda: scalar(s, "SELECT count() FROM dead_letters_v "
                                     "WHERE reason = 'robots_disallowed'") >= 1, 60,
                   "the revisit refused by robots.txt")
        requests = site.count("/p")
    assert requests == 1  # the first visit only
    assert [v for v, _ in _visits(s)[url]] == [0]


def test_new_urls_keep_their_share_of_a_target_busy_with_due_revisits(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    """20 pages revisited every second at 10 requests/s: once the first pass is done, the
    target is never without due revisits. 8 new URLs published then are started in turn
    with them (the fetch stage's revisit and new-URL queues alternate), not one after
    another behind every revisit queued before them. The order is the site's."""
    s = settings.replace(revisit="every 1s", rate_cap=10.0)
    create_all_topics(s)
    ws = fleet(s)
    with ChangingSite(HOST, site_port) as site:
        for i in range(20):
            site.add(f"/o{i}", "etag")
        ws.start_pipeline()
        ws.start("revisit")
        publish_seeds(s, [canonicalize(site.url(f"/o{i}")) for i in range(20)])
        wait_until(lambda: len(site.conditionals) >= 30, 60, "revisits under way")
        publish_seeds(s, [canonicalize(site.add(f"/new{i}", "etag")) for i in range(8)])
        wait_until(lambda: all(site.count(f"/new{i}") for i in range(8)), 60,
                   "every new page fetched")
        order = [path for path, _, _ in list(site.conditionals)]
    firsts = [order.index(f"/new{i}") for i in range(8)]
    between = order[min(firsts):max(firsts) + 1]
    # in turn: a revisit between two new URLs (without the turns: none, one after another)
    assert sum(p.startswith("/o") for p in between) >= 4, between


def _live_seen_keys(s: Settings) -> set[str]:
    """The keys ``crawl.seen`` holds on the broker (each key's latest record, tombstones
    removing it): what a restore rebuilds the seen store from."""
    latest: dict[str, bool] = {}
    for r in read_topic(s, topology_of(s).seen):
        latest[(r.key or b"").decode()] = r.value is not None
    return {k for k, live in latest.items() if live}


def _visits_of(keys: set[str], url: str) -> list[int]:
    return sorted(0 if k.endswith(f"|{url}") else int(k.rsplit(" visit:", 1)[1])
                  for k in keys if k.endswith(f"|{url}") or f"|{url} visit:" in k)


def test_the_seen_store_keeps_a_pages_first_and_latest_visit_and_suppresses_a_replay(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    """A 6 s dedupe horizon (one attempt, a 6 s lease). Page ``slow`` is revisited every
    9 s, past the horizon: after three visits ``crawl.seen`` holds its visit 0 and latest
    visit only. Page ``fast`` is revisited every 2 s, within it: its keys of the last
    horizon stay, and a copy of its previous visit's frontier record put back on the
    frontier then is suppressed, never fetched or stored again."""
    s = settings.replace(max_attempts=1, session_timeout_ms=6000, max_poll_interval_ms=6000,
                         revisit="once", revisits={"127.0.0.7*": "every 9s",
                                                   "127.0.0.8*": "every 2s"})
    assert s.dedupe_horizon_s == 6.0
    create_all_topics(s)
    ws = fleet(s)
    with ChangingSite(HOST, site_port) as slow_site, \
            ChangingSite("127.0.0.8", site_port) as fast_site:
        slow = canonicalize(slow_site.add("/slow", "etag"))
        fast = canonicalize(fast_site.add("/fast", "etag"))
        ws.start_pipeline()
        ws.start("revisit")
        publish_seeds(s, [slow, fast])
        wait_until(_at_least(s, [slow], 3), 90, "three visits of the slow page")
        keys = _live_seen_keys(s)
        slow_visits = {v for v, _ in _visits(s)[slow]}
        # the fast page's previous visit, still within the horizon: its record again
        fast_keys = _visits_of(_live_seen_keys(s), fast)
        replayed = fast_keys[-2]
        codec = default_codec()
        frontier = [r for t in (topology_of(s).frontier, topology_of(s).frontier_high)
                    for r in read_topic(s, t) if r.value is not None]
        (copy,) = [r for r in frontier
                   if (job := codec.decode_as(CrawlJob, r.value, r.headers))["url"] == fast
                   and job.get("visit") == replayed]
        fetch = ws.all["fetch-0"]
        skipped = fetch.counter("skipped_seen")
        producer = Producer(s.kafka_common())
        producer.produce(copy.topic, copy.value, copy.key, partition=copy.partition,
                         headers=copy.headers)
        assert producer.flush(10) == 0
        wait_until(lambda: fetch.counter("skipped_seen") > skipped, 30,
                   "the replayed visit suppressed")
        replayed_rows = [v for v, _ in _visits(s)[fast] if v == replayed]
        fast_visits = max(v for v, _ in _visits(s)[fast])
    slow_keys = _visits_of(keys, slow)
    # visit 0 and the latest visit only; the ones between were pruned with their successor
    assert slow_keys == [0, max(slow_keys)] and max(slow_keys) >= 2, (slow_keys, keys)
    assert max(slow_keys) in slow_visits
    # the fast page: its previous visit's key was there (younger than the horizon), so
    # its copy was suppressed: that visit stored once
    assert replayed > 0 and 0 in fast_keys, fast_keys
    assert replayed_rows == [replayed], replayed_rows
    # and what the fast page kept is its horizon's visits, not all it made
    assert len(fast_keys) < fast_visits, (fast_keys, fast_visits)
