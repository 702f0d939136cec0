"""robots.txt answers turned into rules (RFC 9309)."""

from __future__ import annotations

import pytest

from consumers.fetch.robots import MAX_ROBOTS_BYTES, refused_rules, rules_from_response

AGENT = "crawlfleet"
SITE = "https://example.com"

ROBOTS = b"""\
User-agent: *
Disallow: /private
Crawl-delay: 1

User-agent: crawlfleet
Disallow: /secret
Allow: /secret/public
"""


def test_200_disallowed_path_refused_other_allowed() -> None:
    rules = rules_from_response(200, b"User-agent: *\nDisallow: /private\n", AGENT)
    assert not rules.unreachable
    assert not rules.allows(f"{SITE}/private", AGENT)
    assert not rules.allows(f"{SITE}/private/deeper?x=1", AGENT)
    assert rules.allows(f"{SITE}/public", AGENT)
    assert rules.allows(f"{SITE}/", AGENT)


def test_group_for_our_agent_replaces_the_star_group() -> None:
    rules = rules_from_response(200, ROBOTS, AGENT)
    # Our own group applies: /secret is off limits, the * group's /private is not.
    assert not rules.allows(f"{SITE}/secret/x", AGENT)
    assert rules.allows(f"{SITE}/secret/public/page", AGENT)
    assert rules.allows(f"{SITE}/private", AGENT)
    # Another agent falls back to the * group.
    assert not rules.allows(f"{SITE}/private", "otherbot")
    assert rules.allows(f"{SITE}/secret/x", "otherbot")


def test_our_group_has_no_crawl_delay_so_star_delay_does_not_apply() -> None:
    rules = rules_from_response(200, ROBOTS, AGENT)
    assert rules.min_interval_s == 0.0
    assert rules_from_response(200, ROBOTS, "otherbot").min_interval_s == 1.0


def test_agent_matching_is_case_insensitive() -> None:
    rules = rules_from_response(200, b"User-agent: CrawlFleet\nDisallow: /\n", AGENT)
    assert not rules.allows(f"{SITE}/anything", AGENT)


def test_disallow_all() -> None:
    rules = rules_from_response(200, b"User-agent: *\nDisallow: /\n", AGENT)
    assert not rules.allows(f"{SITE}/", AGENT)
    assert not rules.allows(f"{SITE}/a/b", AGENT)


def test_empty_200_allows_everything() -> None:
    rules = rules_from_response(200, b"", AGENT)
    assert rules.allows(f"{SITE}/anything", AGENT)
    assert rules.min_interval_s == 0.0


def test_garbage_body_does_not_raise_and_allows() -> None:
    rules = rules_from_response(200, b"\xff\xfe<html>not robots</html>\x00", AGENT)
    assert rules.allows(f"{SITE}/x", AGENT)


def test_only_the_first_512_kib_is_parsed() -> None:
    filler = b"# " + b"x" * (MAX_ROBOTS_BYTES + 10) + b"\n"
    rules = rules_from_response(200, filler + b"User-agent: *\nDisallow: /\n", AGENT)
    assert rules.allows(f"{SITE}/a", AGENT)
    rules = rules_from_response(200, b"User-agent: *\nDisallow: /\n" + filler, AGENT)
    assert not rules.allows(f"{SITE}/a", AGENT)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451])
def test_4xx_allows_everything(status: int) -> None:
    rules = rules_from_response(status, b"User-agent: *\nDisallow: /\n", AGENT)
    assert not rules.unreachable
    assert rules.parser is None
    assert rules.allows(f"{SITE}/anything", AGENT)


@pytest.mark.parametrize("status", [None, 429, 500, 502, 503, 504, 599])
def test_unreachable_disallows_everything(status: int | None) -> None:
    rules = rules_from_response(status, b"User-agent: *\nAllow: /\n", AGENT)
    assert rules.unreachable
    assert not rules.allows(f"{SITE}/", AGENT)
    assert not rules.allows(f"{SITE}/robots-permitted", AGENT)


@pytest.mark.parametrize("status", [100, 304, 301])
def test_odd_statuses_mean_no_rules(status: int) -> None:
    rules = rules_from_response(status, b"", AGENT)
    assert not rules.unreachable
    assert rules.allows(f"{SITE}/x", AGENT)


@pytest.mark.parametrize(
    ("body", "interval"),
    [
        (b"User-agent: *\nCrawl-delay: 2\n", 2.0),
        (b"User-agent: *\nCrawl-delay: 0.5\n", 0.5),
        (b"User-agent: *\nRequest-rate: 1/5s\n", 5.0),
        (b"User-agent: *\nRequest-rate: 2/10s\n", 5.0),
        (b"User-agent: *\nRequest-rate: 1/1m\n", 60.0),
        # The stricter (longer) of the two wins, whichever it is.
        (b"User-agent: *\nCrawl-delay: 3\nRequest-rate: 1/2s\n", 3.0),
        (b"User-agent: *\nCrawl-delay: 1\nRequest-rate: 1/4s\n", 4.0),
        (b"User-agent: crawlfleet\nCrawl-delay: 7\n\nUser-agent: *\nCrawl-delay: 1\n", 7.0),
        (b"User-agent: *\nDisallow: /x\n", 0.0),
    ],
)
def test_min_interval(body: bytes, interval: float) -> None:
    rules = rules_from_response(200, body, AGENT)
    assert rules.min_interval_s == pytest.approx(interval)


def test_no_interval_when_unreachable_or_4xx() -> None:
    assert rules_from_response(None, b"", AGENT).min_interval_s == 0.0
    assert rules_from_response(404, b"Crawl-delay: 9", AGENT).min_interval_s == 0.0


def test_a_file_over_500_kib_is_parsed_up_to_the_cap_not_refused() -> None:
    """RFC 9309 §2.5: a larger file is parsed up to the cap; a rule cut at the cap is dropped."""
    rules_part = b"User-agent: *\nDisallow: /private\n"
    body = rules_part + b"#" * (MAX_ROBOTS_BYTES - len(rules_part) - 12) + b"\nDisallow: /"
    body += b"x" * 100 + b"\nDisallow: /\n"
    rules = rules_from_response(200, body, AGENT)
    assert MAX_ROBOTS_BYTES == 500 * 1024
    assert not rules.unreachable
    assert not rules.allows(f"{SITE}/private", AGENT)
    assert rules.allows(f"{SITE}/public", AGENT)  # neither the cut rule nor the one past it


def test_refused_origin_disallows_and_says_why() -> None:
    rules = refused_rules("address of a.test (127.0.0.1) is not public; allow it with ...")
    assert rules.unreachable and rules.refused is not None
    assert not rules.allows(f"{SITE}/", AGENT)
