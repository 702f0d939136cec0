"""A page's second visit on the real broker and store (issue 45): a conditional GET sent
with what the first visit answered, a 304 stored as a visit ``not_modified`` (the page's
version kept), a changed page detected by its text, a page whose only change is a
timestamp found unchanged, and the same visit published twice fetched and stored once.

The revisit jobs are published here as the revisit stage will (visit 1, the validators
the store holds for visit 0): this test is the fetch → parse → store half of a revisit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.config import Settings
from core.urls import canonicalize, target_of
from infra.topics import topology_of
from producers.frontier import produce_patiently
from schemas.records import CrawlJob
from sites.changing_site import ChangingSite
from streams.io import Encoder, connected_producer, producer_conf
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    publish_seeds,
    query,
    wait_drained,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.6"
PAGES = {"/e": "etag", "/m": "last_modified", "/n": "none", "/c": "clock"}


def _visits(s: Settings) -> dict[tuple[str, int], dict[str, Any]]:
    rows = query(s, "SELECT url, visit, status, outcome, changed, signature, etag, "
                    "last_modified FROM page_visits FINAL")
    return {(str(r[0]), int(r[1])): {"status": int(r[2]), "outcome": r[3],
                                     "changed": int(r[4]), "signature": r[5],
                                     "etag": r[6], "last_modified": r[7]} for r in rows}


def _publish_revisits(s: Settings, jobs: list[CrawlJob]) -> None:
    topo = topology_of(s)
    enc = Encoder(topo, "test-revisits")
    producer = connected_producer(producer_conf(s, "test-revisits"))
    failures: list[str] = []
    for job in jobs:
        produce_patiently(producer, enc.job(topo.frontier, job),
                          lambda err, _m: failures.append(str(err)) if err else None)
    assert producer.flush(30) == 0 and not failures, failures


def _revisit(s: Settings, url: str, first: dict[str, Any]) -> CrawlJob:
    validators = {k: first[k] for k in ("etag", "last_modified", "signature") if first[k]}
    return {"url": url, "target": target_of(url, s.target_mode), "profile": s.default_profile,
            "depth": 0, "attempt": 0, "parent_url": None, "last_error": None, "priority": 0,
            "meta": {}, "delay_ms": 0, "pinned": True, "kind": "page", "visit": 1,
            "validators": validators}


def test_a_second_visit_asks_if_changed_and_stores_what_it_found(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    s = settings
    create_all_topics(s)
    ws = fleet(s)
    with ChangingSite(HOST, site_port) as site:
        urls = {path: canonicalize(site.add(path, mode)) for path, mode in PAGES.items()}
        ws.start_pipeline()
        publish_seeds(s, urls.values())
        wait_drained(s, ws, 120, lambda: len(_visits(s)) >= len(PAGES))
        first = _visits(s)
        assert {first[(u, 0)]["outcome"] for u in urls.values()} == {"new"}
        assert first[(urls["/e"], 0)]["etag"] and first[(urls["/m"], 0)]["last_modified"]
        assert not first[(urls["/n"], 0)]["etag"] and not first[(urls["/c"], 0)]["etag"]
        before = {str(u): str(t) for u, t in query(s, "SELECT url, text FROM pages FINAL")}

        site.change("/n")  # its words change; /c only prints a new time
        jobs = [_revisit(s, u, first[(u, 0)]) for u in urls.values()]
        _publish_revisits(s, jobs)
        wait_drained(s, ws, 120, lambda: len(_visits(s)) >= 2 * len(PAGES))
        second = _visits(s)
        asked = {p: (inm, ims) for p, inm, ims in site.conditionals[len(PAGES):]}

        _publish_revisits(s, jobs)  # the same visit again (a timer fired twice)
        wait_drained(s, ws, 120)
        requests = {p: site.count(p) for p in PAGES}
        third = _visits(s)
        after = {str(u): str(t) for u, t in query(s, "SELECT url, text FROM pages FINAL")}

    outcome = {p: second[(urls[p], 1)]["outcome"] for p in PAGES}
    assert outcome == {"/e": "not_modified", "/m": "not_modified", "/n": "changed",
                       "/c": "unchanged"}
    assert {p: second[(urls[p], 1)]["status"] for p in PAGES} == {
        "/e": 304, "/m": 304, "/n": 200, "/c": 200}
    # the conditional headers were the first visit's answer
    assert asked["/e"] == ('"/e-v0"', None)
    assert asked["/m"][0] is None and asked["/m"][1] == first[(urls["/m"], 0)]["last_modified"]
    assert asked["/n"] == (None, None) and asked["/c"] == (None, None)
    # pages keeps each page's latest version: a 304 leaves the first visit's text
    assert after[urls["/e"]] == before[urls["/e"]] != ""
    assert after[urls["/m"]] == before[urls["/m"]] != ""
    assert "alpha" in before[urls["/n"]] and "bravo" in after[urls["/n"]]
    # visit 1 published twice: one request per page and visit, one row per visit
    assert requests == {p: 2 for p in PAGES}
    assert third == second and len(third) == 2 * len(PAGES)
