"""Seed lines → CrawlJob dicts, with per-line errors and in-input dedupe."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.config import Settings
from core.errors import InvalidURLError
from producers.frontier import PublishReport, jobs_from_lines, parse_line
from schemas.codec import default_codec

SETTINGS = Settings()


def test_plain_url() -> None:
    job = parse_line("  HTTP://Example.COM:80/a?b=2&a=1#frag \n", SETTINGS)
    assert job == {
        "url": "http://example.com/a?a=1&b=2",
        "target": "example.com",
        "profile": SETTINGS.default_profile,
        "depth": 0,
        "attempt": 0,
        "parent_url": None,
        "last_error": None,
        "priority": 0,
        "meta": {},
        "delay_ms": 0,
        # names no profile, and none is configured: pinned to the implicit default one, so
        # its key is default|URL, as every job's was before profiles
        "pinned": True,
        "kind": "page",  # a first visit of a page
        "visit": 0,
        "validators": {},
    }


def test_plain_url_is_unpinned_once_profiles_are_configured() -> None:
    s = Settings(profiles={"desk": {"user_agent": "deskbot/1 (+https://example.org/bot)",
                                    "region": "local"}}, default_profile="desk")
    job = parse_line("http://example.com/a", s)
    assert job is not None
    assert (job["profile"], job["pinned"]) == ("desk", False)  # desk: where placement starts


def test_json_line() -> None:
    line = json.dumps({"url": "https://www.example.co.uk/start", "profile": "mobile",
                       "priority": 1, "meta": {"source": "partner", "batch": 7}})
    job = parse_line(line, SETTINGS)
    assert job is not None
    assert job["url"] == "https://www.example.co.uk/start"
    assert job["target"] == "www.example.co.uk"
    assert job["profile"] == "mobile"
    assert job["priority"] == 1
    assert job["meta"] == {"source": "partner", "batch": "7"}  # values become strings


def test_target_follows_target_mode() -> None:
    job = parse_line("https://www.example.co.uk/start", SETTINGS.replace(target_mode="domain"))
    assert job is not None
    assert job["target"] == "example.co.uk"


def test_default_profile_from_settings() -> None:
    s = SETTINGS.replace(default_profile="desktop")
    assert parse_line("https://example.com/", s)["profile"] == "desktop"  # type: ignore[index]
    job = parse_line('{"url": "https://example.com/", "profile": ""}', s)
    assert job is not None and job["profile"] == "desktop"


@pytest.mark.parametrize(("given", "stored"), [(0, 0), (1, 1), (5, 1), (-3, 0), ("1", 1)])
def test_priority_is_clamped_to_the_two_tiers(given: Any, stored: int) -> None:
    job = parse_line(json.dumps({"url": "https://example.com/", "priority": given}), SETTINGS)
    assert job is not None and job["priority"] == stored


@pytest.mark.parametrize("line", ["", "   ", "\n", "# a comment", "   # indented comment"])
def test_blank_and_comment_lines(line: str) -> None:
    assert parse_line(line, SETTINGS) is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"url": "https://example.com/"', "bad JSON"),
        ('{"profile": "x"}', "url"),
        ('{"url": 42}', "url"),
        ('{"url": "https://example.com/", "priority": "high"}', "priority"),
        ('{"url": "https://example.com/", "priority": [1]}', "priority"),
        ('{"url": "https://example.com/", "priority": Infinity}', "priority"),
        ('{"url": "https://example.com/", "meta": ["a"]}', "meta"),
        ('{"url": "ftp://example.com/file"}', "scheme"),
        ("ftp://example.com/file", "scheme"),
        ("not a url", "scheme"),
        ("http://example.com:99999/", "malformed"),
    ],
)
def test_bad_lines_raise_invalid_url(line: str, reason: str) -> None:
    with pytest.raises(InvalidURLError, match=reason):
        parse_line(line, SETTINGS)


def test_jobs_from_lines_reports_errors_with_line_numbers() -> None:
    lines = [
        "# seeds",                                         # 1
        "https://a.example/",                              # 2
        "{bad json",                                       # 3
        "",                                                # 4
        '{"profile": "x"}',                                # 5
        '{"url": "https://b.example/", "priority": "hi"}',  # 6
        "ftp://c.example/",                                # 7
        '{"url": "https://d.example/", "priority": 1}',     # 8
        '{"url": "https://e.example/", "priority": 1e999}',  # 9
        "https://f.example/",                              # 10
    ]
    report = PublishReport()
    jobs = list(jobs_from_lines(lines, SETTINGS, report))
    assert [j["url"] for j in jobs] == ["https://a.example/", "https://d.example/",
                                        "https://f.example/"]
    assert [n for n, _ in report.errors] == [3, 5, 6, 7, 9]
    assert all(reason for _, reason in report.errors)
    assert report.duplicates == 0
    assert report.published == 0  # publishing is not this function's job


def test_duplicates_after_canonicalisation_dropped_and_counted() -> None:
    lines = [
        "https://example.com/a?x=1&y=2",
        "HTTPS://EXAMPLE.com:443/a?y=2&x=1#frag",
        '{"url": "https://example.com/a?x=1&y=2"}',
        '{"url": "https://example.com/a?x=1&y=2", "profile": "mobile"}',  # other identity
        "https://example.com/b",
        "https://example.com/b",
    ]
    report = PublishReport()
    jobs = list(jobs_from_lines(lines, SETTINGS, report))
    assert [(j["profile"], j["url"]) for j in jobs] == [
        ("default", "https://example.com/a?x=1&y=2"),
        ("mobile", "https://example.com/a?x=1&y=2"),
        ("default", "https://example.com/b"),
    ]
    assert report.duplicates == 3
    assert report.errors == []


def test_first_occurrence_wins_on_duplicates() -> None:
    lines = ['{"url": "https://example.com/", "priority": 1, "meta": {"n": "1"}}',
             '{"url": "https://example.com/", "priority": 0, "meta": {"n": "2"}}']
    report = PublishReport()
    [job] = list(jobs_from_lines(lines, SETTINGS, report))
    assert job["priority"] == 1
    assert job["meta"] == {"n": "1"}


def test_jobs_are_lazy_and_accept_any_iterable() -> None:
    report = PublishReport()
    gen = jobs_from_lines(iter(["https://a.example/", "bad://", "https://b.example/"]),
                          SETTINGS, report)
    assert next(gen)["url"] == "https://a.example/"
    assert report.errors == []
    assert next(gen)["url"] == "https://b.example/"
    assert [n for n, _ in report.errors] == [2]


def test_jobs_encode_as_crawljob() -> None:
    codec = default_codec()
    report = PublishReport()
    lines = ["https://example.com/",
             '{"url": "https://example.org/x", "priority": 1, "meta": {"k": "v"}}']
    for job in jobs_from_lines(lines, SETTINGS, report):
        payload, headers = codec.encode("CrawlJob", job)
        assert codec.decode("CrawlJob", payload, headers) == job


def test_a_line_with_words_after_its_url_is_a_bad_line() -> None:
    """Issue 44: "http://a/ check this" was published as http://a/%20check%20this and
    fetched; it is one bad line with its reason, and the good lines still go through."""
    report = PublishReport()
    jobs = list(jobs_from_lines(["http://a.example/ check this first", "http://b.example/",
                                 "http://c.example/\tnote"], SETTINGS, report))
    assert [j["url"] for j in jobs] == ["http://b.example/"]
    assert [n for n, _ in report.errors] == [1, 3]
    assert all("not one URL" in why for _, why in report.errors)
