"""Revisit policies (issue 45) as pure logic, over many simulated cycles."""

from __future__ import annotations

import pytest

from core.config import Settings
from core.errors import ConfigError
from core.revisits import RevisitPolicies, RevisitPolicy


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
