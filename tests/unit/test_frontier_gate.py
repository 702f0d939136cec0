"""A crawl's brand-new frontier is known empty: its seeds do not wait for a lag measurement
(on a freshly started broker that waits for the group coordinator, a second or more)."""

from __future__ import annotations

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
        gate._probe.lag = _refuse  # type: ignore[method-assign]
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
