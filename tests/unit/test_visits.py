"""A page's visits (issue 45): conditional GET, the 304 answer, the text signature, and what
parse and store make of a revisit. Pure: no broker, no store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers.fetch.conditional import request_headers, response_validators
from consumers.fetch.http import Response
from consumers.fetch.outcomes import OutcomeRules
from consumers.parse import ParseStage, RecentSet
from consumers.signature import text_signature
from consumers.store import NO_NEXT_VISIT, keeps_version, next_due_at, visit_outcome, visit_row
from core.config import load_settings
from core.errors import DecodeError
from core.revisits import RevisitPolicies
from infra.clickhouse import VISIT_COLUMNS
from infra.topics import topology_of
from schemas.keys import LASTMOD, REVISIT_INTERVAL, job_dedupe_key
from schemas.records import CrawlJob, FetchResult, ParsedPage
from streams.io import Encoder
from streams.ledger import Pending

URL = "http://a.test/page"
ETAG = '"v7"'
LM = "Mon, 30 Nov 2026 10:00:00 GMT"


def _job(**over: Any) -> CrawlJob:
    job: dict[str, Any] = {
        "url": URL, "target": "a.test", "profile": "default", "depth": 1, "attempt": 0,
        "parent_url": None, "last_error": None, "priority": 0, "meta": {"campaign": "c"},
        "delay_ms": 0, "pinned": True, "kind": "page", "visit": 0, "validators": {}, **over}
    return job  # type: ignore[return-value]


# --- conditional GET ----------------------------------------------------------------------

def test_a_revisit_sends_what_its_last_visit_answered() -> None:
    assert request_headers({"etag": ETAG, "last_modified": LM, "signature": "ab"}) == {
        "If-None-Match": ETAG, "If-Modified-Since": LM}
    assert request_headers({"signature": "ab"}) == {}  # nothing a server could compare
    assert request_headers(None) == {}


def test_an_answers_validators_are_kept_only_if_they_can_be_sent_back() -> None:
    assert response_validators(ETAG, LM) == {"etag": ETAG, "last_modified": LM}
    assert response_validators("x" * 600, "a\r\nSet-Cookie: y") == {}
    assert response_validators(None, None) == {}


# --- the text signature -------------------------------------------------------------------

def test_a_changing_timestamp_or_token_alone_is_no_change() -> None:
    a = text_signature("Daily news. Generated at 12:03:44 on 2026-12-06, visitor 48213.")
    b = text_signature("Daily news. Generated at 09:15:02 on 2026-12-07, visitor 48377.")
    c = text_signature("Daily  NEWS.\nGenerated at 09:15:02 on 2026-12-07, visitor a9f3k2q.")
    assert a == b == c


def test_a_changed_word_is_a_change() -> None:
    assert text_signature("Daily news: the bridge is open") != \
        text_signature("Daily news: the bridge is closed")
    assert text_signature("a b") != text_signature("b a")  # order counts
    assert len(text_signature("")) == 32


# --- the fetch stage's outcome of a 304 ---------------------------------------------------

def _rules() -> OutcomeRules:
    s = load_settings(topic_prefix="u.", partitions=4)
    topo = topology_of(s)
    return OutcomeRules(s, topo, Encoder(topo, "w1"), "w1")


def _answer(job: CrawlJob, status: int, validators: dict[str, str] | None = None
            ) -> tuple[Any, list[dict[str, Any]]]:
    rules = _rules()
    pj = Pending(("u.crawl.frontier", 0), 5, 1, job, job_dedupe_key(job))
    resp = Response(URL, status, "text/html", b"", None, 7, [], None,
                    validators=validators or {})
    res = rules.response(pj, resp, 0.0)
    return res, [rules.enc.codec.decode(rules.topology.record_of(o.topic), o.value, o.headers)
                 for o in res.outputs]


def test_a_304_to_a_revisit_is_a_visit_not_modified() -> None:
    job = _job(visit=2, validators={"etag": ETAG, "last_modified": LM, "signature": "s1"})
    res, (fetched,) = _answer(job, 304, {"etag": '"v8"'})
    assert res.seen == ("DONE", 0)
    assert (res.outcome, res.reason) == ("ok", "not_modified")
    assert fetched["status"] == 304 and fetched["body"] == b""
    assert fetched["job"]["visit"] == 2
    # the answer's newer ETag wins; the Last-Modified it did not repeat is kept
    assert fetched["validators"] == {"etag": '"v8"', "last_modified": LM}


def test_a_304_nobody_asked_for_is_not_taken_as_unchanged() -> None:
    res, _ = _answer(_job(), 304)  # a first visit sends no validators
    assert res.reason == "unexpected_304" and res.seen[0] == "DEAD"


def test_a_200_carries_the_answers_validators_for_the_next_visit() -> None:
    _, (fetched, *_) = _answer(_job(), 200, {"etag": ETAG})
    assert fetched["validators"] == {"etag": ETAG}


# --- what parse makes of a visit ----------------------------------------------------------

class _Gate:
    def add(self, n: int) -> None:
        self.added = n


def _parse(job: CrawlJob, status: int, body: bytes, validators: dict[str, str] | None = None,
           revisit: str = "once") -> tuple[ParsedPage, list[CrawlJob]]:
    page, jobs, _ = _parse_all(job, status, body, validators, revisit)
    return page, jobs


def _parse_all(job: CrawlJob, status: int, body: bytes, validators: dict[str, str] | None,
               revisit: str) -> tuple[ParsedPage, list[CrawlJob], list[CrawlJob]]:
    """The page, the link jobs and the next visits of a parse."""
    s = load_settings(topic_prefix="u.", partitions=4)
    stage = object.__new__(ParseStage)  # its parsing alone: no consumer, no gate thread
    stage.settings, stage.topology = s, topology_of(s)
    stage.encoder, stage.worker = Encoder(stage.topology, "p1"), "p1"
    stage._recent, stage._allowed, stage._gate = RecentSet(), frozenset(), _Gate()  # type: ignore[assignment]
    stage._revisits = RevisitPolicies(revisit, {})
    stage.status = type("S", (), {"add": lambda *a: None})()  # type: ignore[assignment]
    result: FetchResult = {
        "job": job, "final_url": URL, "status": status, "content_type": "text/html",
        "body": body, "fetched_at_ms": 1_780_000_000_000, "elapsed_ms": 5, "redirects": [],
        "worker": "f1", "profile_bundle_version": "", "http_version": "",
        "tls_version": "", "code_revision": "", "outcome": "ok", "reason": "",
        "attempt_ms": 5, "fetcher_version": "", "validators": validators or {}}
    outs = stage._outputs(result)
    codec, topo = stage.encoder.codec, stage.topology
    page = codec.decode_as(ParsedPage, outs[0].value, outs[0].headers)
    jobs = [codec.decode_as(CrawlJob, o.value, o.headers) for o in outs[1:]
            if topo.record_of(o.topic) == "CrawlJob" and o.topic != topo.revisits]
    nxt = [codec.decode_as(CrawlJob, o.value, o.headers) for o in outs
           if o.topic == topo.revisits]
    return page, jobs, nxt


HTML = b"<html><title>T</title><body><p>The bridge is open at 12:00.</p>" \
       b"<a href='/next'>next</a></body></html>"


def test_a_first_visit_is_changed_and_follows_its_links() -> None:
    page, jobs = _parse(_job(), 200, HTML, {"etag": ETAG})
    assert (page["visit"], page["changed"]) == (0, True)
    assert page["validators"] == {"etag": ETAG, "signature": page["signature"]}
    assert [j["url"] for j in jobs] == ["http://a.test/next"]
    assert (page["pinned"], page["meta"]) == (True, {"campaign": "c"})


def test_a_revisit_with_the_same_text_is_unchanged_and_emits_no_links() -> None:
    first, _ = _parse(_job(), 200, HTML)
    later = HTML.replace(b"12:00", b"13:30")  # only the clock moved
    page, jobs = _parse(_job(visit=1, validators=first["validators"]), 200, later)
    assert (page["visit"], page["changed"], jobs) == (1, False, [])
    assert page["signature"] == first["signature"]


def test_a_revisit_with_new_text_is_changed() -> None:
    first, _ = _parse(_job(), 200, HTML)
    page, jobs = _parse(_job(visit=1, validators=first["validators"]), 200,
                        HTML.replace(b"open", b"closed"))
    assert page["changed"] is True and page["signature"] != first["signature"]
    assert [j["url"] for j in jobs] == ["http://a.test/next"]


def test_a_304_revisit_keeps_the_last_signature_and_emits_nothing() -> None:
    last = {"etag": ETAG, "signature": "ab" * 16}
    page, jobs = _parse(_job(visit=3, validators=last), 304, b"", {"etag": ETAG})
    assert (page["status"], page["changed"], page["text"], jobs) == (304, False, "", [])
    assert page["validators"] == last


def test_a_sitemaps_lastmod_sets_the_first_adaptive_interval() -> None:
    """The first visit of a page a sitemap listed as unchanged for 3 days: its next visit
    is 3 days away (adaptive 1h..7d), not 1 h; one listed without lastmod gets 1 h; the
    next visit does not carry the lastmod on, and then steers from its own interval."""
    fetched_s = 1_780_000_000  # _parse_all's fetched_at_ms
    old = datetime.fromtimestamp(fetched_s - 3 * 86400, UTC).isoformat()
    _, _, [nxt] = _parse_all(_job(validators={LASTMOD: old}), 200, HTML, None,
                             "adaptive 1h..7d")
    assert nxt["delay_ms"] == 3 * 86400 * 1000
    assert nxt["meta"][REVISIT_INTERVAL] == "259200" and LASTMOD not in nxt["validators"]
    _, _, [plain] = _parse_all(_job(), 200, HTML, None, "adaptive 1h..7d")
    assert plain["delay_ms"] == 3600 * 1000
    _, _, [again] = _parse_all(nxt, 200, HTML, None, "adaptive 1h..7d")  # unchanged
    assert again["delay_ms"] == int(1.5 * 3 * 86400 * 1000)
    _, _, [fixed] = _parse_all(_job(validators={LASTMOD: old}), 200, HTML, None, "every 6h")
    assert fixed["delay_ms"] == 6 * 3600 * 1000


# --- what the store keeps -----------------------------------------------------------------

@pytest.mark.parametrize(("visit", "status", "changed", "outcome", "kept"), [
    (0, 200, True, "new", True),
    (2, 200, True, "changed", True),
    (2, 200, False, "unchanged", True),
    (2, 304, False, "not_modified", False),  # pages keeps the version it had
])
def test_every_visit_is_a_row_and_a_304_keeps_the_last_version(
        visit: int, status: int, changed: bool, outcome: str, kept: bool) -> None:
    page = {"dedupe_key": f"default|{URL}", "url": URL, "target": "a.test",
            "profile": "default", "status": status, "fetched_at_ms": 1_780_000_000_000,
            "visit": visit, "changed": changed, "signature": "s",
            "validators": {"etag": ETAG}, "parse_worker": "parse-0"}
    assert visit_outcome(page) == outcome  # type: ignore[arg-type]
    assert keeps_version(page) is kept  # type: ignore[arg-type]
    row = dict(zip(VISIT_COLUMNS, visit_row(page, "c1."), strict=True))  # type: ignore[arg-type]
    assert (row["visit"], row["status"], row["outcome"], row["changed"], row["etag"],
            row["crawl"], row["parse_worker"]) == (visit, status, outcome, int(changed), ETAG,
                                                   "c1.", "parse-0")


# --- the next visit parse plans ------------------------------------------------------------

def test_a_visit_plans_the_next_one_with_what_it_answered() -> None:
    _, _, (nxt,) = _parse_all(_job(meta={"campaign": "c", "egress": "p1"}), 200, HTML,
                              {"etag": ETAG}, "every 6h")
    assert (nxt["url"], nxt["visit"], nxt["delay_ms"]) == (URL, 1, 6 * 3600 * 1000)
    assert nxt["validators"]["etag"] == ETAG and len(nxt["validators"]["signature"]) == 32
    # the user's meta goes on, with the interval; not the egress this visit went through
    assert nxt["meta"] == {"campaign": "c", "revisit_interval_s": "21600"}
    assert job_dedupe_key(nxt) == f"default|{URL} visit:1"


def test_an_adaptive_revisit_grows_while_unchanged_and_shrinks_on_a_change() -> None:
    _, _, (n1,) = _parse_all(_job(), 200, HTML, None, "adaptive 1h..1d")
    assert n1["delay_ms"] == 3600_000  # the first revisit: the minimum
    _, _, (n2,) = _parse_all(n1, 304, b"", {"etag": ETAG}, "adaptive 1h..1d")
    assert (n2["visit"], n2["delay_ms"]) == (2, 5400_000)  # unchanged: x1.5
    _, _, (n3,) = _parse_all(n2, 200, HTML.replace(b"open", b"shut"), None,
                             "adaptive 1h..1d")
    assert n3["delay_ms"] == 3600_000  # changed: x0.5, floored at the minimum


def test_once_plans_nothing_and_a_failed_visit_plans_nothing() -> None:
    assert _parse_all(_job(), 200, HTML, None, "once")[2] == []
    assert _parse_all(_job(), 404, b"gone", None, "every 1h")[2] == []


def test_the_stored_visit_says_when_the_next_one_is_due() -> None:
    """The page record carries the interval its revisit job waits (ParsedPage v8), from
    which page_visits' next_due_at is the parse time plus it; no next visit: none due."""
    page, _, (nxt,) = _parse_all(_job(), 200, HTML, None, "every 6h")
    assert page["next_visit_ms"] == nxt["delay_ms"] == 6 * 3600 * 1000
    parsed = page["parsed_at_ms"]
    assert isinstance(parsed, datetime)
    assert next_due_at(page) == parsed + timedelta(hours=6)
    assert visit_row(page, "")[VISIT_COLUMNS.index("next_due_at")] == next_due_at(page)
    _, _, (n1,) = _parse_all(_job(), 200, HTML, None, "adaptive 1h..1d")
    unchanged, _, (n2,) = _parse_all(n1, 304, b"", {"etag": ETAG}, "adaptive 1h..1d")
    assert unchanged["next_visit_ms"] == n2["delay_ms"] == 5400_000
    for failed in (_parse_all(_job(), 404, b"gone", None, "every 1h")[0],
                   _parse_all(_job(), 200, HTML, None, "once")[0]):
        assert failed["next_visit_ms"] == 0 and next_due_at(failed) == NO_NEXT_VISIT


def test_a_due_time_past_what_the_store_holds_is_refused_alone() -> None:
    page = {"parsed_at_ms": 1_780_000_000_000, "next_visit_ms": 1 << 62}
    with pytest.raises(DecodeError, match="outside what the store holds"):
        next_due_at(page)  # type: ignore[arg-type]
