"""The fetch session's Kafka paths against a consumer that behaves as librdkafka does, where
no broker is needed to reach the case: a revoke served *inside* ``consume()``, right after
``poll()`` returned a record the session has not admitted yet.

librdkafka serves rebalance callbacks from within poll()/consume(); consume_ready calls poll()
for the first record and consume() for the rest, so a revoke can run between a record being
returned (its position moved past it) and the session admitting it. A commit in that
callback from ``position()`` would move the group's offset past a record nobody processed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from consumers.fetch.stage import FetchStage, _Session
from core.config import Settings
from streams.committer import TxnAbortedError
from streams.control import ControlState
from streams.io import FencedError, HandOverError, Output


class _Msg:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._tp = (topic, partition, offset)

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def offset(self) -> int:
        return self._tp[2]

    def error(self) -> None:
        return None


class LibrdkafkaLikeConsumer:
    """Positions move when records are returned; a pending revoke is served inside
    ``consume()``, calling the registered callback before it returns."""

    def __init__(self, topic: str, partition: int, next_offset: int) -> None:
        self.topic, self.partition = topic, partition
        self.next_offset = next_offset
        self.assigned = {(topic, partition)}
        self.on_revoke: Any = None
        self.revoke_pending = False

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(self.assigned)]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.next_offset
                               if (tp.topic, tp.partition) in self.assigned else -1001)
                for tp in tps]

    def pause(self, tps: list[TopicPartition]) -> None:
        return None

    def resume(self, tps: list[TopicPartition]) -> None:
        return None

    def poll(self, timeout: float) -> _Msg:
        msg = _Msg(self.topic, self.partition, self.next_offset)
        self.next_offset += 1
        self.revoke_pending = True  # the group rebalances now
        return msg

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        if self.revoke_pending:
            self.revoke_pending = False
            revoked = [TopicPartition(self.topic, self.partition)]
            self.on_revoke(self, revoked)
            self.assigned.clear()
        return []

    def consumer_group_metadata(self) -> object:
        return object()


class RecordingCommitter:
    def __init__(self) -> None:
        self.offsets: list[dict[tuple[str, int], int]] = []

    def commit(self, consumer: Any, outputs: list[Output], offsets: list[TopicPartition],
               track: frozenset[str] = frozenset()) -> dict[tuple[str, int], int]:
        self.offsets.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        return {}


class _Control:
    def __init__(self) -> None:
        self.state = ControlState()

    def poll(self, timeout: float) -> bool:
        return False


def test_a_revoke_inside_consume_commits_no_offset_past_an_unadmitted_record(
        tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, bootstrap_servers="127.0.0.1:1")
    stage = FetchStage(settings, worker_id="fetch-test")

    async def scenario() -> tuple[RecordingCommitter, list[Any]]:
        session = _Session(stage)
        topic = session.topo.frontier
        consumer = LibrdkafkaLikeConsumer(topic, 0, next_offset=10)
        consumer.on_revoke = session.kafka._on_revoke
        committer = RecordingCommitter()
        session.kafka.consumer = consumer  # type: ignore[assignment]
        session.kafka.committer = committer  # type: ignore[assignment]
        session.kafka.control = _Control()  # type: ignore[assignment]
        # The partition is ours from its committed offset 10: nothing consumed yet.
        session.ledger.assign([(topic, 0)], {(topic, 0): 10})
        msgs = session.kafka._poll(0.0)  # poll() returns offset 10, the revoke runs in consume()
        session.intake.admit(msgs)  # too late: the partition is gone, the record is dropped
        await asyncio.sleep(0)
        session.seen.close()
        session.parked.store.close()
        session.kafka.kx.shutdown(wait=False)
        return committer, msgs

    committer, msgs = asyncio.run(scenario())
    assert [m.offset() for m in msgs] == [10]
    topic = stage.topology.frontier
    # The record at 10 was never processed: the next owner must read it.
    for offsets in committer.offsets:
        assert offsets.get((topic, 0), 10) <= 10, offsets


class FailingCommitter(RecordingCommitter):
    """A commit that fails as the broker makes it fail (an abortable error, or a fencing)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def commit(self, consumer: Any, outputs: list[Output], offsets: list[TopicPartition],
               track: frozenset[str] = frozenset()) -> dict[tuple[str, int], int]:
        raise self.error


def _revoke_with(tmp_path: Path, error: Exception) -> tuple[Any, list[Any], int]:
    """A fetch session with finished work whose hand-over commit raises ``error``: (what
    broke the session, what the next poll returned, the consumer polls it made)."""
    settings = Settings(data_dir=tmp_path, bootstrap_servers="127.0.0.1:1")
    stage = FetchStage(settings, worker_id="fetch-test")

    async def scenario() -> tuple[Any, list[Any], int]:
        session = _Session(stage)
        topic = session.topo.frontier
        consumer = LibrdkafkaLikeConsumer(topic, 0, next_offset=10)
        consumer.on_revoke = session.kafka._on_revoke
        session.kafka.consumer = consumer  # type: ignore[assignment]
        session.kafka.committer = FailingCommitter(error)  # type: ignore[assignment]
        session.kafka.control = _Control()  # type: ignore[assignment]
        # Offset 10 finished (nothing held for it): the hand-over has it to commit.
        session.ledger.assign([(topic, 0)], {(topic, 0): 10})
        epoch = session.ledger.admit((topic, 0), 10)
        assert epoch is not None
        assert session.ledger.finish_raw((topic, 0), 10, epoch, [])
        consumer.next_offset = 11
        consumer.on_revoke(consumer, [TopicPartition(topic, 0)])
        polled = consumer.next_offset
        after = session.kafka._poll(0.0)
        session.seen.close()
        session.parked.store.close()
        session.kafka.kx.shutdown(wait=False)
        return session.kafka.broken, after, consumer.next_offset - polled

    return asyncio.run(scenario())


def test_a_failed_hand_over_ends_the_session_as_one_that_must_rejoin_afresh(
        tmp_path: Path) -> None:
    broken, after, polls = _revoke_with(tmp_path, TxnAbortedError("ILLEGAL_GENERATION"))
    # The stage leaves its group before rejoining on this error only (see test_stage_rejoin).
    assert isinstance(broken, HandOverError), broken
    # Nothing more is taken from a consumer whose session is over.
    assert after == [] and polls == 0


def test_a_fenced_hand_over_is_not_taken_for_one_that_may_leave(tmp_path: Path) -> None:
    broken, _, _ = _revoke_with(tmp_path, FencedError("transaction fenced"))
    # A newer twin holds the instance id: leaving by it would evict the twin.
    assert isinstance(broken, FencedError) and not isinstance(broken, HandOverError)
