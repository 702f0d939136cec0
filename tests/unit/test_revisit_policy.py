"""Revisit policies (issue 45) as pure logic, over many simulated cycles."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.config import Settings
from core.errors import ConfigError
from core.revisits import RevisitPolicies, RevisitPolicy, listed_age_s


def test_policies_are_read_from_their_text() -> None:
    assert RevisitPolicy.parse("once") == RevisitPolicy()
    assert RevisitPolicy.parse("every 6h") == RevisitPolicy("every", 21600, 21600)
    assert RevisitPolicy.parse("adaptive 10m..7d") == RevisitPolicy("adaptive", 600, 604800)


@pytest.mark.parametrize("bad", ["", "always", "every", "every 6", "every 0s", "every -1h",
                                 "adaptive 1h", "adaptive 2h..1h", "every 1h 2h"])
def test_a_bad_policy_is_refused_with_its_text(bad: str) -> None:
    with pytest.raises(ConfigError):
        RevisitPolicy.parse(bad)


def test_the_settings_refuse_a_bad_policy() -> None:
    with pytest.raises(ConfigError, match="revisit"):
        Settings(revisits={"*.example.org": "every day"})


def test_every_keeps_its_interval_whatever_the_page_does() -> None:
    p = RevisitPolicy.parse("every 1h")
    assert [p.next_interval(last, changed) for last, changed in
            [(None, True), (3600, False), (3600, True)]] == [3600, 3600, 3600]
    assert RevisitPolicy().next_interval(None, True) is None


def test_adaptive_settles_near_the_change_rate_within_its_bounds() -> None:
    """A page that changes every 4 h, visited adaptively over 200 simulated visits: the
    interval stays within the bounds and oscillates around the change period."""
    p = RevisitPolicy.parse("adaptive 10m..1d")
    t, seen_version = 0.0, 0
    interval: float | None = None
    intervals = []
    for _ in range(200):
        nxt = p.next_interval(interval, seen_version != int(t // 14400))
        seen_version = int(t // 14400)
        assert nxt is not None and 600 <= nxt <= 86400
        interval = nxt
        intervals.append(interval)
        t += interval
    tail = intervals[100:]
    assert 3600 <= sum(tail) / len(tail) <= 4 * 14400, sum(tail) / len(tail)
    never = RevisitPolicy.parse("adaptive 10m..1d")
    i: float | None = None
    for _ in range(40):
        i = never.next_interval(i, False)
    assert i == 86400  # a page that never changes drifts to the maximum


def test_the_first_matching_pattern_wins_else_the_default() -> None:
    ps = RevisitPolicies("once", {"news.example.org": "every 15m",
                                  "*.example.org": "every 1d"})
    assert ps.for_target("news.example.org").low_s == 900
    assert ps.for_target("www.example.org").low_s == 86400
    assert ps.for_target("example.com").mode == "once"
    assert ps.any and not RevisitPolicies("once", {}).any


# --- a sitemap's lastmod -------------------------------------------------------------------

AT_MS = 1_780_000_000_000  # the first visit's time


def _lastmod(days_before: float) -> str:
    """A lastmod as the sitemap stage writes it: ISO 8601 in UTC."""
    return datetime.fromtimestamp(AT_MS / 1000 - days_before * 86400, UTC).isoformat()


def test_lastmod_age_is_read_against_the_visits_time() -> None:
    assert listed_age_s(_lastmod(3), AT_MS) == pytest.approx(3 * 86400)
    assert listed_age_s(_lastmod(-1), AT_MS) == pytest.approx(-86400)  # in the future
    decoded = datetime.fromtimestamp(AT_MS / 1000, UTC)  # a timestamp-millis field, decoded
    assert listed_age_s(_lastmod(3), decoded) == pytest.approx(3 * 86400)
    naive = datetime.fromtimestamp(AT_MS / 1000 - 60, UTC).replace(tzinfo=None).isoformat()
    assert listed_age_s(naive, AT_MS) == pytest.approx(60)  # no zone: UTC
    assert listed_age_s("2026-05-28", AT_MS) is not None  # a date alone is a lastmod too
    assert listed_age_s("last tuesday", AT_MS) is None
    assert listed_age_s(None, AT_MS) is None and listed_age_s("", AT_MS) is None


@pytest.mark.parametrize(("days_before", "first_s"), [
    (30, 7 * 86400),  # unchanged for a month: starts at max, not 10 half-steps below it
    (3, 3 * 86400),  # unchanged for 3 days: starts there
    (0.5 / 24, 3600),  # changed half an hour ago: at min
    (-2, 3600),  # dated in the future: no hint of a slow page, min
])
def test_an_adaptive_first_interval_is_the_pages_listed_age_within_bounds(
        days_before: float, first_s: float) -> None:
    p = RevisitPolicy.parse("adaptive 1h..7d")
    age = listed_age_s(_lastmod(days_before), AT_MS)
    assert p.next_interval(None, True, age) == pytest.approx(first_s)
    assert p.next_interval(None, True) == 3600  # no lastmod: min, as before


def test_lastmod_sets_only_the_first_interval_and_never_a_fixed_one() -> None:
    p = RevisitPolicy.parse("adaptive 1h..7d")
    week = listed_age_s(_lastmod(30), AT_MS)
    # a revisit steers from the interval that led to it; a listed age no longer counts
    assert p.next_interval(7 * 86400, True, week) == 3.5 * 86400
    assert p.next_interval(7200, False, week) == 10800
    assert RevisitPolicy.parse("every 6h").next_interval(None, True, week) == 21600
    assert RevisitPolicy().next_interval(None, True, week) is None  # once stays once
