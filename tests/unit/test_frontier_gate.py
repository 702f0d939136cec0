"""A crawl's brand-new frontier is known empty: its seeds do not wait for a lag measurement
(on a freshly started broker that waits for the group coordinator, a second or more)."""

from __future__ import annotations

import threading

import pytest

from core.config import Settings
from streams.backpressure import FrontierGate

# Nothing listens there: a gate that asked the broker would fail these tests loudly.
OFFLINE = Settings(bootstrap_servers="127.0.0.1:9", topic_prefix="gate-test.",
                   frontier_lag_bound=100)


def _refuse(*_: object) -> int:
    raise AssertionError("the gate asked the broker")


def test_a_known_lag_is_trusted_for_an_interval_without_asking() -> None:
    gate = FrontierGate(OFFLINE, known_lag=0)
    try:
        assert gate._probe is not None
        gate._probe.lag = _refuse  # type: ignore[method-assign,assignment]
        assert not gate.due()
        gate.refresh()  # not due: no measurement
        assert gate.estimate == 0 and not gate.over()
        gate.add(99)
        assert not gate.over()
        gate.add(1)  # what it publishes still counts against the bound
        assert gate.over()
        with pytest.raises(AssertionError, match="asked the broker"):
            gate.refresh(force=True)  # a forced one still measures
    finally:
        gate.close()


def test_an_unknown_lag_is_measured_before_the_first_record() -> None:
    gate = FrontierGate(OFFLINE)
    try:
        assert gate.due()
    finally:
        gate.close()


def test_a_background_gate_never_waits_for_its_measurement() -> None:
    # A parse worker's gate: its read of the fetch group's offsets once blocked the stage's
    # loop for 2.5 s. In the background, the loop goes on with the estimate it has.
    gate = FrontierGate(OFFLINE, background=True)
    assert gate._control is not None
    gate._control.close()
    gate._control = None
    started, release = threading.Event(), threading.Event()

    def slow(*_: object) -> int:
        started.set()
        release.wait(30)
        return 7

    assert gate._probe is not None
    gate._probe.lag = slow  # type: ignore[method-assign,assignment]
    try:
        gate.add(3)
        gate.refresh()  # starts the measurement, returns while it is still blocked
        assert started.wait(10) and not release.is_set()
        assert gate.estimate == 3 and not gate.over()
        gate.refresh()  # one at a time: nothing new starts
        gate.add(2)  # added while it runs: still counted once it is in
        release.set()
        running = gate._running
        assert running is not None and running[0].done.wait(10)
        assert not gate.over()  # takes the result in
        assert gate.estimate == 7 + 2
    finally:
        release.set()
        gate.close()


def test_an_idle_gate_asks_nothing_until_something_is_added() -> None:
    # Issue 43: an idle parse worker's gate measured twice a second for nothing. Under the
    # bound with nothing added since, a due refresh asks nothing; the first addition (or
    # a lag at the bound, waiting to drop) makes it measure again.
    gate = FrontierGate(OFFLINE, known_lag=0)
    asked: list[int] = []

    def count(*_: object) -> int:
        asked.append(1)
        return 40

    assert gate._probe is not None
    gate._probe.lag = count  # type: ignore[method-assign,assignment]
    try:
        gate._at -= 10  # the last measurement is long past: a refresh is due
        assert gate.due()
        gate.refresh()
        assert asked == [] and gate.estimate == 0
        gate.add(1)
        gate.refresh()
        assert asked == [1] and gate.estimate == 40
        gate._at -= 10
        gate.refresh()  # measured at 40 (under 100), nothing added since: idle again
        assert asked == [1]
        gate._lag = 100  # at the bound: keeps measuring to learn when it drops
        gate.refresh()
        assert asked == [1, 1]
    finally:
        gate.close()
