"""Every visit of a page survives in the store and in `crawlfleet trace` (issue 44): two crawls
of one store each number their visits from 0, so ``page_visits`` is keyed by crawl too; a
store made before that gains the key in place; a replay of one crawl still collapses. On an
embedded chDB store, rows written by the store stage's own row functions."""

from __future__ import annotations

import time
from typing import Any

import pytest

from consumers.store import page_event_row, page_row, visit_row
from core.config import Settings
from crawlfleet.trace import SHARED, crawl_of, trace, visit_of_key
from infra.clickhouse import EVENT_COLUMNS, PAGE_COLUMNS, VISIT_COLUMNS, Store
from schemas.keys import dedupe_key
from tests.unit.conftest import OLD_PAGE_VISITS

URL = "http://127.0.0.1:8000/index.html"
T0 = 1_780_000_000_000

@pytest.fixture
def settings(embedded_settings: Settings) -> Settings:
    return embedded_settings


def _page(visit: int, fetched_ms: int, title: str) -> dict[str, Any]:
    return {"dedupe_key": dedupe_key("default", URL), "url": URL, "final_url": URL,
            "target": "127.0.0.1:8000", "profile": "default", "depth": 0, "status": 200,
            "content_type": "text/html", "title": title, "text": title, "links": [],
            "body_bytes": 10, "fetched_at_ms": fetched_ms, "parsed_at_ms": fetched_ms + 5,
            "fetch_worker": "fetch-0", "parse_worker": "parse-0", "visit": visit,
            "changed": True, "outcome": "ok", "attempt": 1, "reason": "", "attempt_ms": 3,
            "fetcher_version": "crawlfleet-fetch/1", "http_version": "1.1",
            "tls_version": "", "profile_bundle_version": "", "code_revision": ""}


def _store(settings: Settings, visits: tuple[tuple[str, int, int, str], ...], offset: int,
           token: str = "") -> None:
    """Store each (crawl, visit, fetched_ms, title) as the store stage does, from records at
    ``<crawl>crawl.parsed:0:<offset + i>``."""
    token = token or str(offset)
    store = Store(settings, owner=True)
    try:
        store.ensure_schema()
        pages = [_page(v, ms, title) for _, v, ms, title in visits]
        ids = [f"{crawl}crawl.parsed:0:{offset + i}" for i, (crawl, *_) in enumerate(visits)]
        store.insert("page_visits", VISIT_COLUMNS,
                     [visit_row(p, crawl) for p, (crawl, *_) in zip(pages, visits,  # type: ignore[arg-type]
                                                                   strict=True)],
                     f"v|{token}")
        store.insert("pages", PAGE_COLUMNS, [page_row(p) for p in pages],  # type: ignore[arg-type]
                     f"p|{token}")
        store.insert("fetch_events", EVENT_COLUMNS,
                     [page_event_row(i, p) for i, p in zip(ids, pages, strict=True)],  # type: ignore[arg-type]
                     f"e|{token}")
    finally:
        store.close()


def _visits(settings: Settings) -> list[tuple[str, int]]:
    store = Store(settings)
    try:
        _, rows = store.query("SELECT crawl, visit FROM page_visits_v ORDER BY crawl, visit")
        return [(str(c), int(v)) for c, v in rows]
    finally:
        store.close()


def test_two_crawls_and_a_revisit_each_show_their_own_steps(settings: Settings) -> None:
    first = (("c1.", 0, int(time.time() * 1000), "one"),)
    _store(settings, first, 0)
    # a replay of that record (in a batch cut differently: another token) stores no visit
    # twice
    _store(settings, first, 0, "replay")
    for offset, (crawl, visit, title) in enumerate(
            (("c1.", 1, "one again"), ("c2.", 0, "two"), ("", 0, "fleet")), 1):
        _store(settings, [(crawl, visit, int(time.time() * 1000), title)], offset)
    assert _visits(settings) == [("", 0), ("c1.", 0), ("c1.", 1), ("c2.", 0)]

    steps = [(e.crawl, e.visit, e.event) for e in trace(settings, URL)]
    want = [(c, v, step) for c, v in (("c1.", 0), ("c1.", 1), ("c2.", 0), ("", 0))
            for step in ("fetched", "parsed", "stored")]
    assert steps == want
    assert [(e.crawl, e.visit, e.event) for e in trace(settings, URL, crawl="c2.")] == \
        [("c2.", 0, step) for step in ("fetched", "parsed", "stored")]
    rows = [e.row() for e in trace(settings, URL)]
    assert [r[-2:] for r in rows[-3:]] == [(SHARED, "0")] * 3
    # the links and title are shown on the visit whose version `pages` holds, the latest
    assert [r[5] for r in rows if r[2] == "parsed"] == ["new", "changed", "new",
                                                        "0 links, title 'fleet'"]


def test_a_store_made_before_crawls_were_kept_gains_the_key_in_place(
        settings: Settings) -> None:
    store = Store(settings, owner=True)
    try:
        store.command(OLD_PAGE_VISITS)
        store.command(f"INSERT INTO page_visits (dedupe_key, visit, url, visited_at) VALUES "
                      f"('{dedupe_key('default', URL)}', 0, '{URL}', now64(3))")
    finally:
        store.close()
    _store(settings, (("c1.", 0, T0, "one"), ("c2.", 0, T0, "two")), 0)  # runs the schema
    _store(settings, (("c1.", 0, T0, "one"),), 0, "again")  # ... again: idempotent
    store = Store(settings)
    try:
        key = store.scalar("SELECT sorting_key FROM system.tables WHERE name = 'page_visits'")
    finally:
        store.close()
    assert key == "dedupe_key, visit, crawl"
    assert _visits(settings) == [("", 0), ("c1.", 0), ("c2.", 0)]  # the old row is kept


@pytest.mark.parametrize(("event_id", "prefix"), [
    ("c1765000000-abc123.crawl.parsed:3:17#attempt", "c1765000000-abc123."),
    ("mycrawl.crawl.telemetry:0:5", "mycrawl."),
    ("crawl.lineage:1:2", ""),
    ("crawl.parsed:0:9#4", ""),
    ("not a place", None),
])
def test_a_rows_crawl_is_the_prefix_of_the_topic_it_came_from(event_id: str,
                                                             prefix: str | None) -> None:
    assert crawl_of(event_id) == prefix


def test_a_jobs_visit_is_read_from_its_key() -> None:
    key = dedupe_key("default", URL)
    assert [visit_of_key(k) for k in (key, f"{key} visit:3", f"{key} visit:2 replay:x",
                                      f"{key} replay:y")] == [0, 3, 2, 0]
