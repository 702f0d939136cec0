"""A sink's batches linger while its input trickles (issue 43: a polite fleet's store paid a
whole batch -- an insert per table, a commit -- for every page), and are cut as promptly as
before when a burst comes. The rule alone, then the sink's own batch loop on a scripted
consumer and a clock the test moves (no broker: the cut is the sink's logic)."""

from __future__ import annotations

from typing import Any

import pytest

import streams.sink_stage as sink_stage
from streams.idle_poll import IdlePoll
from streams.sink_stage import SinkStage
from streams.trickle import Trickle
from streams.worker import StopFlag


def test_three_small_batches_in_a_row_are_a_trickle_and_a_big_one_ends_it() -> None:
    t = Trickle(1.0)
    for _ in range(2):
        t.ended(1)
    assert not t.trickling and t.wait_s(0.25) == 0.25 and t.cuts_on_quiet(1)
    t.ended(3)
    assert t.trickling and t.wait_s(0.25) == 1.0
    assert not t.cuts_on_quiet(49) and t.cuts_on_quiet(50)
    t.ended(0)  # an empty poll: no batch, the rate unknown
    assert t.trickling
    t.ended(400)
    assert not t.trickling and t.wait_s(0.25) == 0.25


def test_no_linger_configured_is_never_a_trickle() -> None:
    t = Trickle(0.0)
    for _ in range(10):
        t.ended(1)
    assert not t.trickling and t.cuts_on_quiet(1) and t.wait_s(0.25) == 0.25


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Msg:
    def __init__(self, at: float) -> None:
        self.at = at

    def error(self) -> None:
        return None


class _Consumer:
    """Records that arrive at scripted times; a poll waits on the test's clock."""

    def __init__(self, clock: _Clock, arrivals: list[float]) -> None:
        self.clock, self.todo = clock, sorted(arrivals)

    def poll(self, timeout: float) -> _Msg | None:
        if self.todo and self.todo[0] <= self.clock.now + timeout:
            self.clock.now = max(self.clock.now, self.todo[0])
            return _Msg(self.todo.pop(0))
        self.clock.now += timeout
        return None

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        out: list[_Msg] = []
        while self.todo and self.todo[0] <= self.clock.now and len(out) < n:
            out.append(_Msg(self.todo.pop(0)))
        return out


class _Sink(SinkStage):
    stage = "store"

    def write(self, batch: list[Any]) -> dict[tuple[str, int], int]:
        return {}

    def batch_limits(self) -> tuple[int, float, float]:
        return 5000, 0.25, 0.15  # the store's defaults


def _batches(monkeypatch: pytest.MonkeyPatch, linger_s: float, arrivals: list[float]
             ) -> list[tuple[float, list[float]]]:
    """(cut time, arrival times) of each batch the sink's loop makes of ``arrivals``."""
    clock = _Clock()
    monkeypatch.setattr(sink_stage, "time", type("T", (), {"monotonic": staticmethod(clock)}))
    sink = object.__new__(_Sink)
    sink.stop, sink.trickle, sink._idle = StopFlag(), Trickle(linger_s), IdlePoll(clock)
    sink.poll_gaps = type("G", (), {"tick": lambda self: None})()
    sink.status = type("S", (), {"write": lambda self: None})()
    consumer = _Consumer(clock, [clock.now + a for a in arrivals])
    out = []
    while consumer.todo:
        batch = sink._collect(consumer)  # type: ignore[arg-type]
        if batch:
            out.append((clock.now - 1000.0, [m.at - 1000.0 for m in batch]))  # type: ignore[attr-defined]
    return out


def test_a_page_every_half_second_is_stored_in_batches_of_two_or_three(
        monkeypatch: pytest.MonkeyPatch) -> None:
    arrivals = [0.5 * i for i in range(40)]  # the default cap: 2 pages/s
    alone = _batches(monkeypatch, 0.0, arrivals)
    lingering = _batches(monkeypatch, 1.0, arrivals)
    assert [len(b) for _, b in alone] == [1] * 40  # each page paid a batch of its own
    sizes = [len(b) for _, b in lingering]
    # three batches to see the trickle, then two or three pages each (the last: what is left)
    assert sizes[:3] == [1, 1, 1] and all(n in (2, 3) for n in sizes[3:-1])
    assert len(lingering) <= 3 + (40 - 3 + 1) // 2
    # no page waits longer than the linger and one poll piece before it is written
    assert max(cut - at for cut, b in lingering for at in b) <= 1.0 + 0.2 + 1e-9
    assert sum(sizes) == 40


def test_a_burst_after_a_trickle_is_cut_when_it_goes_quiet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trickle = [0.5 * i for i in range(6)]
    burst = [10.0 + 0.001 * i for i in range(300)]
    batches = _batches(monkeypatch, 1.0, trickle + burst + [20.0, 20.5, 21.0])
    cut, rows = next((c, b) for c, b in batches if b[0] >= 10.0)
    assert len(rows) == 300 and cut - rows[-1] <= 0.15 + 1e-9  # the quiet cut, not the linger
    # after the burst the input is not a trickle yet: the next pages are cut one by one
    assert [len(b) for _, b in batches[-3:]] == [1, 1, 1]
