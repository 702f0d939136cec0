"""A commit blocks the polling thread for at most one transaction timeout, whatever the cluster.

The producer below answers as librdkafka does while every broker is down: each call waits
its whole timeout and fails with a retriable ``_TIMED_OUT``. Time is a fake clock, so the
test measures what the committer would block for without waiting for it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from core.errors import KafkaStageError
from streams.committer import CallWatch, TxnAbortedError, TxnCommitter
from streams.io import Output


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))


class _DownCluster:
    """Every call that talks to a broker waits out its timeout; ``ok_after`` calls succeed."""

    def __init__(self, clock: _Clock, ok_after: int = 10**9,
                 answer_s: float | None = None) -> None:
        self.clock = clock
        self.ok_after = ok_after
        self.answer_s = answer_s  # a broker that fails fast (coordinator moving), not silent
        self.calls: list[tuple[str, float]] = []
        self.produced = 0

    def _wait(self, what: str, timeout: float) -> None:
        self.calls.append((what, timeout))
        if len(self.calls) > self.ok_after:
            self.clock.now += 0.01
            return
        self.clock.now += timeout if self.answer_s is None else min(timeout, self.answer_s)
        raise _timed_out()

    def begin_transaction(self) -> None:
        return

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.produced += 1

    def poll(self, timeout: float) -> int:
        self.clock.now += timeout
        return 0

    def send_offsets_to_transaction(self, offsets: Any, meta: Any, timeout: float) -> None:
        self._wait("send_offsets", timeout)

    def commit_transaction(self, timeout: float) -> None:
        self._wait("commit", timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._wait("abort", timeout)


class _Consumer:
    def consumer_group_metadata(self) -> object:
        return object()


def _committer(producer: _DownCluster, budget_s: float = 30.0) -> TxnCommitter:
    c = TxnCommitter.__new__(TxnCommitter)
    c.transactional_id = "fetch-test"
    c.budget_s = budget_s
    c.producer = producer  # type: ignore[assignment]
    c.clock, c.sleep = producer.clock.monotonic, producer.clock.sleep
    return c


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


def test_a_commit_to_a_cluster_that_is_down_gives_up_within_one_transaction_timeout(
        clock: _Clock) -> None:
    producer = _DownCluster(clock)
    began = clock.now
    with pytest.raises(KafkaStageError) as info:
        _committer(producer).commit(_Consumer(), [Output("t", 0, b"k", b"v", [])],
                                    [TopicPartition("in", 0, 5)])
    assert not isinstance(info.value, TxnAbortedError)  # unknown outcome, not an abort
    assert "did not finish within the transaction timeout" in str(info.value)
    # Five retries of 30-s calls (the former policy) blocked the polling thread for 150 s
    # per call, past the consumer's max.poll.interval.ms once offsets and commit added up.
    assert clock.now - began <= 30.0 + 1e-6
    assert producer.calls and all(t <= 30.0 for _, t in producer.calls)


def test_a_commit_that_answers_within_its_budget_succeeds_after_retries(clock: _Clock) -> None:
    producer = _DownCluster(clock, ok_after=2, answer_s=3.0)
    committer = _committer(producer)
    committer.commit(_Consumer(), [Output("t", 0, b"k", b"v", [])], [TopicPartition("in", 0, 5)])
    assert [w for w, _ in producer.calls] == ["send_offsets"] * 3 + ["commit"]
    # Each retry is given what is left of the one budget, not a fresh 30 s.
    assert producer.calls[1][1] < producer.calls[0][1]


def test_a_full_producer_queue_is_bounded_by_the_same_budget(clock: _Clock) -> None:
    class _Full(_DownCluster):
        def produce(self, *args: Any, **kwargs: Any) -> None:
            raise BufferError("queue full")

    producer = _Full(clock)
    began = clock.now
    with pytest.raises(KafkaStageError, match="queue stayed full"):
        _committer(producer).commit(_Consumer(), [Output("t", 0, b"k", b"v", [])], [])
    assert clock.now - began <= 30.0 + 0.1


class _Nudged:
    def __init__(self) -> None:
        self.refreshes = 0

    def list_topics(self, timeout: float) -> None:
        self.refreshes += 1


def test_a_call_past_its_timeout_gets_metadata_refreshes(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka#5456: send_offsets_to_transaction can outlive its timeout; a metadata
    refresh brings back the brokers whose return wakes its coordinator lookup."""
    monkeypatch.setattr(CallWatch, "NUDGE_EVERY_S", 0.05)
    producer = _Nudged()
    with CallWatch(producer, "send_offsets", 0.05):  # type: ignore[arg-type]
        time.sleep(0.6)  # the call that does not return in time
    assert producer.refreshes >= 2
    quiet = _Nudged()
    with CallWatch(quiet, "commit", 5.0):  # type: ignore[arg-type]
        time.sleep(0.1)  # returns within its timeout: left alone
    assert quiet.refreshes == 0


def test_a_call_that_never_returns_ends_the_worker_for_its_supervisor(tmp_path: Path) -> None:
    script = (
        "import time\n"
        "from streams.committer import CallWatch\n"
        "class P:\n"
        "    def list_topics(self, timeout): pass\n"
        "CallWatch.NUDGE_EVERY_S = 0.05\n"
        "CallWatch.HANG_GRACE_S = 0.25\n"
        "with CallWatch(P(), 'send_offsets', 0.05):\n"
        "    time.sleep(10)\n"
        "print('returned')\n")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == CallWatch.EXIT_CODE, done.stderr
    assert "returned" not in done.stdout and "the worker restarts" in done.stderr
    assert time.monotonic() - began < 10  # it did not wait for the call
