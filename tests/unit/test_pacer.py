"""The fleet-wide cap split among live members."""

from __future__ import annotations

import itertools

from consumers.fetch.pacer import Pacer


def _dispatches(p: Pacer, seconds: float, step: float = 0.001) -> list[float]:
    out, now = [], 0.0
    while now < seconds:
        n = p.available(now, 100)
        p.take(now, n)
        out += [now] * n
        now += step
    return out


def test_no_cap_allows_everything() -> None:
    p = Pacer(0.0)
    assert p.available(0.0, 57) == 57
    assert p.next_at() is None


def test_share_is_fleet_cap_divided_by_members() -> None:
    alone = _dispatches(Pacer(10.0, members=1), 10.0)
    shared = _dispatches(Pacer(10.0, members=4), 10.0)
    assert 97 <= len(alone) <= 101  # strict spacing only ever errs on the slow side
    assert 24 <= len(shared) <= 26


def test_membership_change_applies_at_once() -> None:
    p = Pacer(20.0, members=1)
    first = _dispatches(p, 1.0)
    p.set_members(2)
    p.set_members(0)  # never below one member
    assert p.members == 1
    assert len(first) in (20, 21)


def test_spacing_is_strict() -> None:
    times = _dispatches(Pacer(5.0, members=2), 5.0)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.4 - 1e-9


def test_share_follows_owned_partitions() -> None:
    p = Pacer(12.0)
    p.set_members(2, mine=3, total=4)
    assert abs(p.interval - 1.0 / 9.0) < 1e-9
    p.set_members(2, mine=0, total=4)  # unknown assignment: an even split
    assert abs(p.interval - 1.0 / 6.0) < 1e-9
