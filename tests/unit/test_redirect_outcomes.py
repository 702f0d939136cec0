"""A redirect is an answer of its own: the page is recorded with its 3xx status, and an
in-scope target becomes a new frontier job (through dedupe, robots.txt and its own cap)."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.fetch.http import Response
from consumers.fetch.outcomes import OutcomeRules
from core.config import load_settings
from infra.topics import topology_of
from schemas.keys import REDIRECT_HOPS, REPLAY_META, dedupe_key
from streams.io import Encoder, Output
from streams.ledger import Pending

URL = "http://a.test/start"


def _rules(**kw: Any) -> OutcomeRules:
    s = load_settings(topic_prefix="u.", partitions=4, **kw)
    topo = topology_of(s)
    return OutcomeRules(s, topo, Encoder(topo, "w1"), "w1")


def _job(**kw: Any) -> dict[str, Any]:
    return {"url": URL, "target": "a.test", "profile": "default", "depth": 2, "attempt": 0,
            "parent_url": None, "last_error": None, "priority": 0, "meta": {}, "delay_ms": 0,
            **kw}


def _decoded(rules: OutcomeRules, out: Output) -> dict[str, Any]:
    assert out.value is not None
    value = rules.enc.codec.decode(rules.topology.record_of(out.topic), out.value, out.headers)
    assert isinstance(value, dict)
    return value


def _redirect(rules: OutcomeRules, location: str, job: dict[str, Any] | None = None,
              status: int = 302) -> tuple[list[Output], list[dict[str, Any]]]:
    job = job or _job()
    pj = Pending(("u.crawl.frontier", 0), 5, 1, job, dedupe_key("default", job["url"]))
    res = rules.response(pj, Response(job["url"], status, "text/html", b"", None, 3, [],
                                      location), 0.0)
    assert res.seen[0] == "DONE"
    return res.outputs, [_decoded(rules, o) for o in res.outputs]


def test_in_scope_redirect_becomes_a_new_job_with_a_hop_count() -> None:
    rules = _rules()
    outs, recs = _redirect(rules, "/next?b=2&a=1")
    topics = [o.topic for o in outs]
    # the attempt's telemetry rides in the fetched record (FetchResult v3)
    assert topics == [rules.topology.fetched, rules.topology.lineage, rules.topology.frontier]
    page, enqueued, job = recs
    assert enqueued["state"] == "enqueued" and enqueued["detail"] == "redirect"
    assert enqueued["url"] == job["url"] and enqueued["parent_url"] == URL
    assert page["status"] == 302 and page["body"] == b""
    assert page["final_url"] == URL and page["redirects"] == ["http://a.test/next?a=1&b=2"]
    assert page["outcome"] == "ok" and page["reason"] == "redirect"
    assert job["url"] == "http://a.test/next?a=1&b=2" and job["target"] == "a.test"
    assert job["depth"] == 2 and job["attempt"] == 0 and job["parent_url"] == URL
    assert job["meta"][REDIRECT_HOPS] == "1"


@pytest.mark.parametrize("location", [
    "http://evil.test/x", "//evil.test/x", "HTTP://EVIL.TEST/x", "ftp://a.test/file",
    "javascript:alert(1)", "http://[::1", "https://a.test:99999/"])
def test_out_of_scope_or_uncrawlable_redirect_is_recorded_not_followed(location: str) -> None:
    rules = _rules()
    outs, recs = _redirect(rules, location)
    assert [o.topic for o in outs] == [rules.topology.fetched]
    assert recs[0]["status"] == 302
    assert recs[0]["reason"] == "redirect_out_of_scope"


def test_a_redirect_target_is_a_new_job_without_the_replay_mark() -> None:
    rules = _rules()
    _, recs = _redirect(rules, "/next", _job(meta={REPLAY_META: "abc", "k": "v"}))
    assert recs[-1]["meta"] == {"k": "v", REDIRECT_HOPS: "1"}


def test_seeds_scope_follows_a_redirect_to_another_seed_target() -> None:
    rules = _rules(scope="seeds", allowed_targets=("a.test", "b.test"))
    outs, recs = _redirect(rules, "http://b.test/")
    assert recs[-1]["target"] == "b.test" and recs[0]["reason"] == "redirect"
    outs, recs = _redirect(rules, "http://c.test/")
    assert recs[0]["reason"] == "redirect_out_of_scope" and len(outs) == 1


def test_the_hop_cap_spans_jobs_and_a_self_redirect_is_a_loop() -> None:
    rules = _rules(max_redirects=3)
    outs, recs = _redirect(rules, "/again", _job(meta={REDIRECT_HOPS: "3"}))
    assert recs[0]["reason"] == "redirect_loop" and len(outs) == 1
    outs, recs = _redirect(rules, "/start")
    assert recs[0]["reason"] == "redirect_loop" and len(outs) == 1
    outs, recs = _redirect(rules, "/on", _job(meta={REDIRECT_HOPS: "junk"}))
    assert recs[-1]["meta"][REDIRECT_HOPS] == "1"  # unreadable meta counts as no hops


def test_a_3xx_without_location_is_still_dead() -> None:
    rules = _rules()
    job = _job()
    pj = Pending(("u.crawl.frontier", 0), 5, 1, job, dedupe_key("default", URL))
    res = rules.response(pj, Response(URL, 302, "", b"", None, 3, [], None), 0.0)
    assert res.seen[0] == "DEAD"
