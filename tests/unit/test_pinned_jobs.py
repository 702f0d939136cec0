"""Pinned and unpinned jobs: the one dedupe-key rule by job type, what the publisher makes of
a line, and what a job's links and redirect targets inherit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from consumers.fetch.http import Response
from consumers.fetch.outcomes import OutcomeRules
from consumers.parse import link_job
from core.config import load_settings
from core.errors import InvalidURLError
from core.profiles import parse_profiles, valid_name
from infra.topics import topology_of
from producers.frontier import PublishReport, jobs_from_lines, parse_line
from producers.replay import replay_id, replay_job
from schemas.codec import default_codec
from schemas.keys import dedupe_key, job_dedupe_key, page_key
from streams.io import Encoder
from streams.ledger import Pending
from tests.unit import test_schema_compat

UA = "examplebot/2.1 (+https://example.org/bot)"
URL = "http://a.test/page"
#: Two configured profiles, "desk" the default.
SETTINGS = load_settings(None, default_profile="desk", profiles={
    "desk": {"user_agent": UA, "region": "local"},
    "mobile": {"user_agent": UA, "region": "local"}})


def _job(**kw: Any) -> dict[str, Any]:
    return {"url": URL, "target": "a.test", "profile": "desk", "depth": 0, "attempt": 0,
            "parent_url": None, "last_error": None, "priority": 0, "meta": {}, "delay_ms": 0,
            "pinned": True, **kw}


# --- the key ------------------------------------------------------------------------------


def test_pinned_key_names_the_profile_unpinned_key_does_not() -> None:
    assert dedupe_key("desk", URL) == f"desk|{URL}"  # unchanged for pinned jobs
    assert dedupe_key("desk", URL, pinned=True) == f"desk|{URL}"
    assert dedupe_key("desk", URL, pinned=False) == f"*|{URL}"
    assert dedupe_key("desk", URL, pinned=False) == dedupe_key("mobile", URL, pinned=False)
    assert dedupe_key("desk", URL) != dedupe_key("mobile", URL)


def test_no_profile_can_be_named_like_the_unpinned_key() -> None:
    assert not valid_name("*")
    with pytest.raises(Exception, match="name"):
        parse_profiles({"*": {"user_agent": UA, "region": "local"}}, {})


def test_page_key_follows_the_job_type() -> None:
    assert page_key(_job()) == f"desk|{URL}"
    assert page_key(_job(pinned=False)) == f"*|{URL}"
    assert page_key(_job(pinned=False, profile="mobile")) == page_key(_job(pinned=False))
    # A job without the field (parked on disk or stored as JSON before schema v3) was pinned.
    old = {k: v for k, v in _job().items() if k != "pinned"}
    assert page_key(old) == f"desk|{URL}"


def test_replay_keys_build_on_the_page_key() -> None:
    unpinned = _job(pinned=False)
    assert job_dedupe_key(unpinned) == f"*|{URL}"
    marked = replay_job(unpinned, "crawl.dead:0:7")  # type: ignore[arg-type]
    assert marked["pinned"] is False  # a replay keeps the job's type
    assert job_dedupe_key(marked) == f"*|{URL} replay:{replay_id('crawl.dead:0:7')}"
    moved = {**marked, "profile": "mobile"}  # placed on another profile: same key
    assert job_dedupe_key(moved) == job_dedupe_key(marked)  # type: ignore[arg-type]


def test_v2_v3_compatibility_is_checked_both_ways() -> None:
    v2 = json.loads((test_schema_compat.SCHEMA_DIR / "crawl_job.v2.avsc").read_text())
    v3 = json.loads((test_schema_compat.SCHEMA_DIR / "crawl_job.v3.avsc").read_text())
    assert ("crawl_job", v2, v3) in test_schema_compat.PAIRS
    pinned = next(f for f in v3["fields"] if f["name"] == "pinned")
    assert pinned["type"] == "boolean" and pinned["default"] is True


def test_an_old_v2_job_decodes_as_pinned() -> None:
    codec = default_codec()
    v2 = next(v for v in codec.versions("CrawlJob") if v.version == 2)
    old = {k: v for k, v in _job(profile="mobile").items() if k != "pinned"}
    payload, headers = codec.encode("CrawlJob", old, version=v2)
    job = codec.decode("CrawlJob", payload, headers)
    assert job["pinned"] is True and page_key(job) == f"mobile|{URL}"


# --- the publisher ------------------------------------------------------------------------


def _line(**obj: Any) -> str:
    return json.dumps({"url": URL, **obj})


@pytest.mark.parametrize(("line", "pin", "profile", "pinned"), [
    (URL, None, "desk", False),  # names none: unpinned, starting at default_profile
    (_line(), None, "desk", False),
    (_line(profile=""), None, "desk", False),
    (_line(profile="mobile"), None, "mobile", True),  # names one: pinned to it
    (_line(profile="mobile", pinned=False), None, "mobile", False),  # explicit wins
    (_line(pinned=True), None, "desk", True),
    (URL, "mobile", "mobile", True),  # --profile pins lines naming none ...
    (_line(profile="desk"), "mobile", "desk", True),  # ... not lines naming one
    (_line(pinned=False), "mobile", "mobile", False),
])
def test_publisher_decides_pinned(line: str, pin: str | None, profile: str,
                                  pinned: bool) -> None:
    job = parse_line(line, SETTINGS, pin)
    assert job is not None
    assert (job["profile"], job["pinned"]) == (profile, pinned)


@pytest.mark.parametrize("line", [_line(pinned="yes"), _line(pinned=1),
                                  _line(profile="has space"), _line(profile="*")])
def test_bad_pinned_or_profile_name_is_a_bad_line(line: str) -> None:
    with pytest.raises(InvalidURLError):
        parse_line(line, SETTINGS)


def test_publisher_dedupes_by_job_type() -> None:
    lines = [URL, _line(), _line(profile="mobile"), _line(profile="desk"),
             _line(profile="mobile"), _line(profile="mobile", pinned=False)]
    report = PublishReport()
    jobs = list(jobs_from_lines(lines, SETTINGS, report))
    # the unpinned line once (its profile-free key); each pin once
    assert [(j["profile"], j["pinned"]) for j in jobs] == [
        ("desk", False), ("mobile", True), ("desk", True)]
    assert report.duplicates == 3


def test_unknown_profiles_are_published_counted_and_warned_once() -> None:
    lines = [_line(profile="ghost"), json.dumps({"url": "http://a.test/2", "profile": "ghost"}),
             _line(profile="phantom"), "http://a.test/3"]
    report = PublishReport()
    jobs = list(jobs_from_lines(lines, SETTINGS, report))
    assert len(jobs) == 4 and not report.errors  # still published
    assert report.unknown_profiles == {"ghost": 2, "phantom": 1}
    warning = report.profile_warning()
    assert warning is not None and "3 lines" in warning
    assert "ghost (2)" in warning and "phantom (1)" in warning
    assert "unknown_profile" in warning
    assert PublishReport().profile_warning() is None


def test_publish_profile_option_unknown_is_counted_per_line() -> None:
    report = PublishReport()
    jobs = list(jobs_from_lines([URL, "http://a.test/2"], SETTINGS, report, "ghost"))
    assert [j["profile"] for j in jobs] == ["ghost", "ghost"]
    assert report.unknown_profiles == {"ghost": 2}


# --- what derived jobs inherit -----------------------------------------------------------


@pytest.mark.parametrize("pinned", [True, False])
def test_links_inherit_profile_and_pinned(pinned: bool) -> None:
    page = _job(profile="mobile", pinned=pinned, depth=1)
    child = link_job(page, "http://a.test/next", "a.test", {})  # type: ignore[arg-type]
    assert (child["profile"], child["pinned"]) == ("mobile", pinned)
    assert child["depth"] == 2 and child["parent_url"] == URL
    default_codec().encode("CrawlJob", child)  # a complete job


@pytest.mark.parametrize("pinned", [True, False])
def test_redirect_targets_inherit_profile_and_pinned(pinned: bool) -> None:
    s = load_settings(None, topic_prefix="u.", partitions=4)
    topo = topology_of(s)
    rules = OutcomeRules(s, topo, Encoder(topo, "w1"), "w1")
    job = _job(profile="mobile", pinned=pinned)
    pj = Pending(("u.crawl.frontier", 0), 5, 1, job, page_key(job))  # type: ignore[arg-type]
    res = rules.response(pj, Response(URL, 302, "text/html", b"", None, 3, [], "/moved"), 0.0)
    [frontier] = [o for o in res.outputs if o.topic == topo.frontier]
    [lineage] = [o for o in res.outputs if o.topic == topo.lineage]
    child = rules.enc.codec.decode("CrawlJob", frontier.value, frontier.headers)
    assert (child["profile"], child["pinned"]) == ("mobile", pinned)
    event = rules.enc.codec.decode("LineageEvent", lineage.value, lineage.headers)
    assert event["dedupe_key"] == dedupe_key("mobile", "http://a.test/moved", pinned)


def test_publish_refuses_a_malformed_profile_option_before_reaching_kafka() -> None:
    from typer.testing import CliRunner

    from crawlfleet.cli import app
    result = CliRunner().invoke(app, ["publish", "-", "--profile", "*",
                                      "--bootstrap", "127.0.0.1:1"], input=URL + "\n")
    assert result.exit_code == 2
    assert "not a profile name" in result.output
