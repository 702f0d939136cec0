"""The store's rows: a decoded record whose values its table cannot hold is refused alone."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from consumers.store import _UINT_MAX, dead_row, enqueued_rows, event_row, fits, page_row
from core.errors import DecodeError
from infra.clickhouse import LINEAGE_COLUMNS, SQL_DIR
from schemas.codec import default_codec
from schemas.records import ParsedPage

TS = datetime(2026, 1, 1, tzinfo=UTC)


def _page(**over: Any) -> dict[str, Any]:
    return {"dedupe_key": "default|http://a.test/", "url": "http://a.test/",
            "final_url": "http://a.test/", "target": "a.test", "profile": "default",
            "depth": 1, "status": 200, "content_type": "text/html", "title": "t", "text": "x",
            "links": [], "body_bytes": 10, "fetched_at_ms": TS, "fetch_worker": "f",
            "parse_worker": "p", **over}


def _event(**over: Any) -> dict[str, Any]:
    return {"ts_ms": TS, "url": "http://a.test/", "target": "a.test", "profile": "default",
            "attempt": 0, "status": 200, "outcome": "ok", "reason": "", "elapsed_ms": 5,
            "bytes": 10, "worker": "f", "fetcher_version": "1", "http_version": "1.1",
            "tls_version": "", "profile_bundle_version": "", "code_revision": "", **over}


def _dead(**over: Any) -> dict[str, Any]:
    return {"job": None, "raw": b"\x00", "source_topic": "crawl.frontier",
            "reason": "undecodable", "error": "e", "attempts": 1, "worker": "f",
            "version": "1", "failed_at_ms": TS, **over}


def test_unsigned_columns_are_those_of_the_schema() -> None:
    """Every UInt column of the stored tables is checked, with its type's largest value."""
    sql = (SQL_DIR / "schema.sql").read_text()
    tables = {m["table"]: m["body"] for m in re.finditer(
        r"CREATE TABLE IF NOT EXISTS (?P<table>\w+) \((?P<body>.*?)\) ENGINE", sql, re.S)}
    found = {}
    for table in ("pages", "fetch_events", "dead_letters", "lineage", "quarantines",
                  "page_visits"):
        for col, bits in re.findall(r"^\s*(\w+)\s+UInt(\d+)", tables[table], re.M):
            found[col] = (1 << int(bits)) - 1
    assert found == _UINT_MAX


def test_valid_rows_fit() -> None:
    assert fits("pages", page_row(_page())) == page_row(_page())
    assert fits("fetch_events", event_row("e", _event()))
    assert fits("dead_letters", dead_row("d", _dead()))


def test_deep_pages_are_capped_not_refused() -> None:
    assert fits("pages", page_row(_page(depth=70_000)))[5] == 65535


@pytest.mark.parametrize(("table", "row"), [
    ("pages", page_row(_page(depth=-1))),
    ("pages", page_row(_page(status=-1))),
    ("pages", page_row(_page(status=70_000))),
    ("pages", page_row(_page(body_bytes=-5))),
    ("fetch_events", event_row("e", _event(attempt=-1))),
    ("fetch_events", event_row("e", _event(elapsed_ms=-1))),
    ("fetch_events", event_row("e", _event(bytes=-(2**31)))),
    ("dead_letters", dead_row("d", _dead(attempts=2**31 - 1))),
])
def test_values_outside_a_column_are_a_decode_error(table: str, row: tuple[Any, ...]) -> None:
    with pytest.raises(DecodeError, match="outside"):
        fits(table, row)


def test_a_pages_enqueued_links_become_lineage_rows_keyed_by_its_place() -> None:
    """ParsedPage v4 carries the links its page put on the frontier; the store writes their
    ``enqueued`` lineage rows, one per link, under the page record's place and the link's
    index (a replayed batch's second copy collapses), with the parse worker and version."""
    page = _page(parsed_at_ms=TS, parse_version="9.9", enqueued=[
        {"url": "http://b.test/1", "target": "b.test", "dedupe_key": "default|http://b.test/1"},
        {"url": "http://a.test/2", "target": "a.test", "dedupe_key": "*|http://a.test/2"}])
    rows = enqueued_rows("crawl.parsed:3:17", page)
    assert [dict(zip(LINEAGE_COLUMNS, r, strict=True)) for r in rows] == [
        {"event_id": "crawl.parsed:3:17#0", "ts": TS, "dedupe_key": "default|http://b.test/1",
         "url": "http://b.test/1", "target": "b.test", "profile": "default",
         "state": "enqueued", "attempt": 0, "parent_url": "http://a.test/", "detail": "link",
         "stage": "parse", "worker": "p", "version": "9.9"},
        {"event_id": "crawl.parsed:3:17#1", "ts": TS, "dedupe_key": "*|http://a.test/2",
         "url": "http://a.test/2", "target": "a.test", "profile": "default",
         "state": "enqueued", "attempt": 0, "parent_url": "http://a.test/", "detail": "link",
         "stage": "parse", "worker": "p", "version": "9.9"}]
    assert all(fits("lineage", r) for r in rows)


def test_a_page_written_before_v4_enqueues_no_rows() -> None:
    """A v3 ParsedPage in flight across the upgrade decodes with no enqueued links (its
    links' lineage records were written on crawl.lineage then)."""
    codec = default_codec()
    v3 = next(v for v in codec.versions("ParsedPage") if v.version == 3)
    old = {k: v for k, v in _page(parsed_at_ms=TS).items()}
    old.update(profile_bundle_version="", http_version="", tls_version="", code_revision="")
    value, headers = codec.encode("ParsedPage", old, v3)
    page = codec.decode_as(ParsedPage, value, headers)
    assert page["enqueued"] == [] and page["parse_version"] == ""
    assert enqueued_rows("crawl.parsed:0:1", page) == []
