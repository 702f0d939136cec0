"""A fetched page carries its attempt's telemetry (FetchResult v3 → ParsedPage v4) and the
store writes the attempt's fetch_events row from the page: one record per page fewer on the
broker, and every attempt still has exactly one event."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from consumers.fetch.http import Response
from consumers.fetch.outcomes import OutcomeRules
from consumers.parse import attempt_egress, attempt_event
from consumers.store import event_row, page_event_row
from core.config import load_settings
from core.versions import FETCHER_VERSION
from infra.clickhouse import EVENT_COLUMNS
from infra.topics import topology_of
from schemas.keys import dedupe_key
from schemas.records import FetchResult, ParsedPage
from streams.io import Encoder, Output
from streams.ledger import Pending

URL = "http://a.test/page"
TS = datetime(2026, 1, 1, tzinfo=UTC)


def _rules() -> OutcomeRules:
    s = load_settings(topic_prefix="u.", partitions=4)
    topo = topology_of(s)
    return OutcomeRules(s, topo, Encoder(topo, "w1"), "w1")


def _answer(rules: OutcomeRules, status: int, body: bytes = b"<html></html>",
            attempt: int = 0) -> tuple[list[Output], list[dict[str, Any]]]:
    job = {"url": URL, "target": "a.test", "profile": "default", "depth": 1,
           "attempt": attempt, "parent_url": None, "last_error": None, "priority": 0,
           "meta": {}, "delay_ms": 0}
    pj = Pending(("u.crawl.frontier", 0), 5, 1, job, dedupe_key("default", URL))
    res = rules.response(pj, Response(URL, status, "text/html", body, None, 7, [], None), 0.0)
    decoded = [rules.enc.codec.decode(rules.topology.record_of(o.topic), o.value, o.headers)
               for o in res.outputs]
    return res.outputs, decoded


def test_a_stored_page_carries_its_attempts_telemetry_instead_of_an_event_record() -> None:
    rules = _rules()
    outs, [page] = _answer(rules, 200, attempt=1)
    assert [o.topic for o in outs] == [rules.topology.fetched]
    assert page["outcome"] == "ok" and page["reason"] == "ok"
    assert page["attempt_ms"] >= 0 and page["fetcher_version"] == FETCHER_VERSION
    assert page["job"]["attempt"] == 1


def test_a_blocked_page_still_sends_its_event_to_the_quarantine_app() -> None:
    """The quarantine app reads crawl.blocks (distinct event ids): that record stays; the
    telemetry row comes from the page."""
    rules = _rules()
    outs, [page, block] = _answer(rules, 403)
    assert [o.topic for o in outs] == [rules.topology.fetched, rules.topology.blocks]
    assert page["outcome"] == "blocked" and page["reason"] == "http_403"
    assert block["outcome"] == "blocked" and block["event_id"] and block["status"] == 403


def test_a_failed_attempt_is_still_an_event_record_of_its_own() -> None:
    rules = _rules()
    outs, [_, event] = _answer(rules, 503)
    assert [o.topic for o in outs] == [rules.topology.retry(2), rules.topology.telemetry]
    assert event["outcome"] == "retry" and event["reason"] == "http_503"


def _v3_result(**over: Any) -> FetchResult:
    rules = _rules()
    _, [page] = _answer(rules, 200, body=b"x" * 40, attempt=2)
    return cast(FetchResult, {**page, **over})


def test_the_parse_stage_rebuilds_the_event_of_a_page_it_dead_letters() -> None:
    result = _v3_result()
    event = attempt_event(result)
    assert event is not None
    assert (event["url"], event["attempt"], event["status"], event["outcome"],
            event["bytes"], event["elapsed_ms"], event["worker"]) == (
        URL, 2, 200, "ok", 40, result["attempt_ms"], "w1")
    assert attempt_event(_v3_result(outcome="")) is None  # a v2 record: event of its own


def _page(**over: Any) -> ParsedPage:
    page = {"dedupe_key": f"default|{URL}", "url": URL, "final_url": URL, "target": "a.test",
            "profile": "p1", "depth": 1, "status": 403, "content_type": "text/html",
            "title": "", "text": "", "links": [], "body_bytes": 12, "fetched_at_ms": TS,
            "fetch_worker": "f1", "parse_worker": "p", "parsed_at_ms": TS,
            "profile_bundle_version": "b2", "http_version": "aiohttp/3", "tls_version": "t",
            "code_revision": "abc", "enqueued": [], "parse_version": "0.1",
            "attempt": 1, "outcome": "blocked", "reason": "http_403", "attempt_ms": 55,
            "fetcher_version": "cf/1", "egress": "direct", **over}
    return cast(ParsedPage, page)


def test_the_store_writes_the_pages_attempt_as_the_event_record_would_have_been() -> None:
    """The row from the page equals the row the attempt's own event record gave (its id
    apart: the page record's place), so dashboards read the same either way."""
    page = _page()
    row = page_event_row("crawl.parsed:2:9", page)
    assert row is not None
    as_event = event_row("crawl.parsed:2:9#attempt", {
        "url": URL, "target": "a.test", "profile": "p1", "attempt": 1, "status": 403,
        "outcome": "blocked", "reason": "http_403", "elapsed_ms": 55, "bytes": 12,
        "worker": "f1", "fetcher_version": "cf/1", "http_version": "aiohttp/3",
        "tls_version": "t", "profile_bundle_version": "b2", "code_revision": "abc",
        "ts_ms": TS, "event_id": "x", "egress": "direct"})
    assert dict(zip(EVENT_COLUMNS, row, strict=True)) == \
        dict(zip(EVENT_COLUMNS, as_event, strict=True))
    assert page_event_row("crawl.parsed:2:9", _page(outcome="")) is None


def test_the_egress_of_a_pages_attempt_reaches_its_fetch_events_row() -> None:
    """fetch_events says which exit each attempt took (issue 41, point 3): a page fetched
    through px2 is stored with px2, from the placed job the parse stage reads."""
    rules = _rules()
    job = {"url": URL, "target": "a.test", "profile": "default", "depth": 1, "attempt": 0,
           "parent_url": None, "last_error": None, "priority": 0, "meta": {}, "delay_ms": 0}
    pj = Pending(("u.crawl.frontier", 0), 5, 1, job, dedupe_key("default", URL),
                 profile="default", egress="px2")
    res = rules.response(pj, Response(URL, 200, "text/html", b"<p>x</p>", None, 7, [], None),
                         0.0)
    [page] = [rules.enc.codec.decode(rules.topology.record_of(o.topic), o.value, o.headers)
              for o in res.outputs]
    assert attempt_egress(page["job"]) == "px2"
    event = attempt_event(page)
    assert event is not None and event["egress"] == "px2"
    row = page_event_row("crawl.parsed:2:9", _page(egress="px2"))
    assert row is not None and dict(zip(EVENT_COLUMNS, row, strict=True))["egress"] == "px2"
