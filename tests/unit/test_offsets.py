"""Safe commit points when records complete out of order."""

from __future__ import annotations

import random

import pytest

from streams.offsets import OffsetTracker


def test_nothing_seen() -> None:
    t = OffsetTracker()
    assert t.in_flight == 0
    assert t.commit_point() is None


def test_in_order_completion() -> None:
    t = OffsetTracker()
    t.start(5)
    assert t.commit_point() == 5  # 5 is not done: commit only up to it
    t.done(5)
    assert t.commit_point() == 6


def test_out_of_order_commit_point_is_oldest_in_flight() -> None:
    t = OffsetTracker()
    for o in (10, 11, 12, 13):
        t.start(o)
    t.done(12)
    t.done(13)
    assert t.in_flight == 2
    assert t.commit_point() == 10
    t.done(10)
    assert t.commit_point() == 11
    t.done(11)
    assert t.in_flight == 0
    assert t.commit_point() == 14


def test_all_done_commits_one_past_highest() -> None:
    t = OffsetTracker()
    for o in (3, 7, 4):  # gaps (compacted/transaction markers) are fine
        t.start(o)
    for o in (7, 3, 4):
        t.done(o)
    assert t.commit_point() == 8


def test_commit_point_none_after_committed_without_change() -> None:
    t = OffsetTracker()
    t.start(0)
    t.start(1)
    t.done(0)
    assert t.commit_point() == 1
    t.committed(1)
    assert t.commit_point() is None
    t.start(2)  # started but not done: the oldest in flight is still 1
    assert t.commit_point() is None
    t.done(1)
    assert t.commit_point() == 2
    t.committed(2)
    assert t.commit_point() is None
    t.done(2)
    assert t.commit_point() == 3


def test_advance_to_when_idle() -> None:
    t = OffsetTracker()
    t.start(0)
    t.done(0)
    t.advance_to(5)  # consumer position moved past a transaction marker
    assert t.commit_point() == 5


def test_advance_to_on_a_fresh_tracker() -> None:
    t = OffsetTracker()
    t.advance_to(42)
    assert t.commit_point() == 42


def test_advance_to_ignored_while_in_flight() -> None:
    t = OffsetTracker()
    t.start(0)
    t.start(1)
    t.done(1)
    t.advance_to(10)
    assert t.commit_point() == 0
    t.done(0)
    assert t.commit_point() == 2  # the ignored advance left no trace


def test_advance_to_never_goes_back() -> None:
    t = OffsetTracker()
    for o in range(10):
        t.start(o)
        t.done(o)
    t.advance_to(3)
    assert t.commit_point() == 10


def test_start_after_advance() -> None:
    t = OffsetTracker()
    t.advance_to(7)
    t.start(8)
    assert t.commit_point() == 8
    t.done(8)
    assert t.commit_point() == 9


@pytest.mark.parametrize("seed", range(10))
def test_property_commit_point_never_passes_unfinished_work(seed: int) -> None:
    rng = random.Random(seed)
    t = OffsetTracker()
    pending: set[int] = set()
    highest = -1
    nxt = 0
    committed: int | None = None
    for _ in range(500):
        if rng.random() < 0.55:
            nxt += rng.choice([1, 1, 1, 2])  # occasional gap
            t.start(nxt)
            pending.add(nxt)
            highest = nxt
        elif pending:
            o = rng.choice(sorted(pending))
            pending.discard(o)
            t.done(o)
        assert t.in_flight == len(pending)
        point = t.commit_point()
        expected = min(pending) if pending else (highest + 1 if highest >= 0 else None)
        if point is not None:
            assert point == expected
            if rng.random() < 0.5:
                t.committed(point)
                committed = point
        else:
            assert expected is None or expected == committed
