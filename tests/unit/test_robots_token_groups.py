"""robots.txt per profile token, pure logic: each token obeys its own group (or ``*`` when
the file names it not), and a target's floor is the strictest of the allowed tokens'."""

from __future__ import annotations

from consumers.fetch.robots import rules_from_response, target_interval

ROBOTS = b"""User-agent: alphabot
Crawl-delay: 2
Disallow: /private/

User-agent: gammabot
Request-rate: 1/4

User-agent: *
Disallow: /staff/
"""
URL = "http://site.test"


def test_each_token_obeys_its_own_group_or_the_star_group() -> None:
    rules = rules_from_response(200, ROBOTS, "crawlfleet")
    assert not rules.allows(f"{URL}/private/a", "alphabot")
    assert rules.allows(f"{URL}/staff/a", "alphabot")  # its own group has no such rule
    assert rules.allows(f"{URL}/private/a", "betabot")  # unnamed: the * group
    assert not rules.allows(f"{URL}/staff/a", "betabot")


def test_a_delay_for_one_token_is_that_tokens_only() -> None:
    rules = rules_from_response(200, ROBOTS, "crawlfleet")
    assert rules.interval_for("alphabot") == 2.0
    assert rules.interval_for("betabot") == 0.0
    assert rules.interval_for("gammabot") == 4.0  # Request-rate 1/4 s


def test_the_target_goes_at_the_strictest_pace_of_the_tokens_allowed_on_it() -> None:
    rules = rules_from_response(200, ROBOTS, "crawlfleet")
    assert target_interval(rules, {"alphabot", "betabot"}) == 2.0
    assert target_interval(rules, {"alphabot", "betabot", "gammabot"}) == 4.0
    assert target_interval(rules, {"betabot"}) == 0.0  # alphabot not allowed there
    assert target_interval(rules_from_response(404, b"", "crawlfleet"), {"alphabot"}) == 0.0
