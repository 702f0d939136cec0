"""What a stage does between sessions, by how the last one ended: a session that failed its
hand-over inside a cooperative revocation, or whose commit was refused because its group's
generation moved on, leaves the group (by instance id) before the next joins, so that join
is a fresh one and the assignor places every partition; any other lost session rejoins under
static membership and keeps its partitions, and a fenced one never leaves (the instance id
may be a newer twin's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

import streams.stage as stage_mod
from core.config import Settings
from core.errors import KafkaStageError
from streams.committer import TxnAbortedError, _classify
from streams.io import FencedError, HandOverError
from streams.stage import Stage


class _OneSession(Stage):
    stage = "fetch"

    def __init__(self, settings: Settings, error: Exception) -> None:
        super().__init__(settings, worker_id="fetch-7")
        self.error = error
        self.sessions = 0

    def session(self) -> None:
        self.sessions += 1
        if self.sessions == 1:
            raise self.error
        self.stop.set()


def _run(tmp_path: Path, error: Exception, monkeypatch: pytest.MonkeyPatch) -> tuple[
        list[tuple[str, str]], _OneSession]:
    left: list[tuple[str, str]] = []
    monkeypatch.setattr(stage_mod, "leave_group",
                        lambda s, group, inst: left.append((group, inst)) or True)
    monkeypatch.setattr(stage_mod, "wait_for_kafka", lambda *a, **k: None)
    monkeypatch.setattr(stage_mod, "REJOIN_PAUSE_S", 0.0)
    st = _OneSession(Settings(data_dir=tmp_path, bootstrap_servers="127.0.0.1:1"), error)
    monkeypatch.setattr(st.approval, "wait_approved", lambda stop: not stop.requested)
    st.rejoining()
    return left, st


def test_a_failed_hand_over_leaves_the_group_before_the_next_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    left, st = _run(tmp_path, HandOverError("hand-over commit failed"), monkeypatch)
    assert left == [(st.topology.group("fetch"), st.worker)]
    assert st.sessions == 2  # and it joins again
    assert st.status.counters.get("left_for_rejoin") == 1


@pytest.mark.parametrize("error", [FencedError("transaction fenced"),
                                   KafkaStageError("transaction must abort")])
def test_other_lost_sessions_rejoin_without_leaving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    left, st = _run(tmp_path, error, monkeypatch)
    assert left == []
    assert st.sessions == 2


def test_a_commit_refused_because_the_group_rebalanced_leaves_before_rejoining(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the committer raises when the offsets meet a generation that moved on.
    error = _classify(KafkaException(KafkaError(
        KafkaError.ILLEGAL_GENERATION, "Specified group generation id is not valid",
        txn_requires_abort=True)))
    assert isinstance(error, TxnAbortedError)  # aborted as any abortable commit is
    left, st = _run(tmp_path, error, monkeypatch)
    assert left == [(st.topology.group("fetch"), st.worker)]


@pytest.mark.parametrize("code", [KafkaError.FENCED_INSTANCE_ID, KafkaError.PRODUCER_FENCED])
def test_a_commit_refused_for_a_newer_twin_never_leaves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    error = _classify(KafkaException(KafkaError(code, "fenced", txn_requires_abort=True)))
    assert isinstance(error, FencedError)
    left, _ = _run(tmp_path, error, monkeypatch)
    assert left == []


def test_an_ordinary_abort_rejoins_under_static_membership(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A slow broker's abort, no rebalance: the partitions stay with their owner.
    error = _classify(KafkaException(KafkaError(
        KafkaError._TIMED_OUT, "timed out", txn_requires_abort=True)))
    assert isinstance(error, TxnAbortedError)
    left, _ = _run(tmp_path, error, monkeypatch)
    assert left == []
