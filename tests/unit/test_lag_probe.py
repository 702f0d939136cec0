"""The lag probe never reads low: a partition whose end offset is not known (its leader not
found yet, or no answer within the wait) makes the stage's lag unknown (-1), not a sum over
the other partitions -- the crawl decides "drained" from these figures. And a look does not
wait on a slow answer for longer than ``OFFSETS_WAIT_S``."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import TopicPartition

import infra.lag as lag_mod
from core.config import Settings
from infra.lag import LagProbe


def _probe(positions: dict[tuple[str, int], tuple[int, int]]) -> LagProbe:
    probe = LagProbe(Settings(bootstrap_servers="127.0.0.1:1"))
    probe.positions = lambda group, topics, partitions: positions  # type: ignore[method-assign]
    return probe


def test_a_partition_left_out_makes_the_lag_unknown() -> None:
    full = {("t", 0): (5, 7), ("t", 1): (3, 3)}
    assert _probe(full).lag("g", ["t"], 2) == 2
    assert _probe({("t", 1): (3, 3)}).lag("g", ["t"], 2) == -1  # p0 unknown: not "0 left"


class _SlowAdmin:
    """One partition answers at once, the other never does."""

    def list_offsets(self, request: dict[TopicPartition, Any], **kw: Any) -> dict[Any, Any]:
        out: dict[TopicPartition, Future[Any]] = {}
        for tp in request:
            fut: Future[Any] = Future()
            if tp.partition == 0:
                fut.set_result(type("Info", (), {"offset": 9})())
            out[tp] = fut
        return out


def test_a_look_does_not_wait_past_its_bound_for_an_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lag_mod, "OFFSETS_WAIT_S", 0.1)
    probe = LagProbe(Settings(bootstrap_servers="127.0.0.1:1"))
    probe._admin = _SlowAdmin()  # type: ignore[assignment]
    began = time.monotonic()
    got = probe._offsets({("t", 0), ("t", 1)}, lag_mod.OffsetSpec.latest())  # type: ignore[no-untyped-call]
    assert got == {("t", 0): 9}
    assert time.monotonic() - began < 5  # bounded by the wait, not the 10 s request timeout
