"""The parse stage's bounded recently-emitted filter."""

from __future__ import annotations

from consumers.parse import RecentSet


def test_add_reports_only_the_first_sighting() -> None:
    recent = RecentSet(capacity=10)
    assert "a" not in recent
    assert recent.add("a") is True
    assert "a" in recent
    assert recent.add("a") is False


def test_least_recently_seen_key_is_evicted_first() -> None:
    recent = RecentSet(capacity=2)
    recent.add("a")
    recent.add("b")
    recent.add("a")  # a seen again: b is now the oldest
    recent.add("c")
    assert "a" in recent and "c" in recent
    assert "b" not in recent
    assert recent.add("b") is True  # forgotten, so emitted again (the seen store dedupes)


def test_touch_refreshes_a_present_key_and_adds_nothing() -> None:
    recent = RecentSet(capacity=2)
    assert recent.touch("a") is False
    assert "a" not in recent  # touching an absent key does not add it
    recent.add("a")
    recent.add("b")
    assert recent.touch("a") is True  # a is now the most recent: b goes first
    recent.add("c")
    assert "a" in recent and "b" not in recent
