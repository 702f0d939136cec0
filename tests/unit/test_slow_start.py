"""Slow start: the transaction cap doubles with sustained load and falls back after a lull."""

from __future__ import annotations

from streams.slow_start import SlowStart


def test_cap_starts_at_the_floor_and_doubles_with_each_commit() -> None:
    s = SlowStart(floor=50, window_s=1.0)
    assert s.cap(now=0.0) == 50
    caps = []
    for k in range(5):
        cap = s.cap(now=0.1 * k)
        caps.append(cap)
        s.committed(cap, now=0.1 * k)  # each transaction fills its cap
    assert caps == [50, 100, 200, 400, 800]


def test_cap_follows_the_largest_commit_of_the_window() -> None:
    s = SlowStart(floor=50, window_s=1.0)
    s.committed(1000, now=0.0)
    s.committed(10, now=0.5)  # a small one does not shrink the cap while the big one counts
    assert s.cap(now=0.9) == 2000
    assert s.cap(now=1.2) == 50  # the big one left the window; 2 x 10 is under the floor
    assert s.cap(now=2.0) == 50  # a lull: back to the floor


def test_empty_commits_are_not_load() -> None:
    s = SlowStart(floor=50, window_s=1.0)
    s.committed(0, now=0.0)
    assert s.cap(now=0.1) == 50
