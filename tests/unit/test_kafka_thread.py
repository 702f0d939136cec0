"""The Kafka thread survives what confluent-kafka raises, and a rebalance report asks nothing
of a consumer that may be closing.

confluent-kafka can raise a bare ``KafkaError`` (not an exception class): a fetch worker's
``consumer.close()`` did, from a rebalance callback that asked the closing consumer for its
assignment. It passed the thread pool's ``except BaseException``, killed the Kafka thread,
and the stage awaited that thread's future for ever, deaf to SIGTERM.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import KafkaError, TopicPartition

from core.config import Settings
from core.errors import KafkaStageError
from infra.topics import topology_of
from streams.committer import on_kafka_thread
from streams.membership import Membership


def _raise_bare_kafka_error() -> None:
    """Raise a ``KafkaError`` object as confluent-kafka's C code does."""
    err = KafkaError(KafkaError._DESTROY, "Broker handle destroyed for termination")
    ctypes.pythonapi.PyErr_SetObject(ctypes.py_object(KafkaError), ctypes.py_object(err))


def test_a_bare_kafka_error_becomes_a_stage_error_and_the_thread_lives() -> None:
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(KafkaStageError, match="_DESTROY"):
            pool.submit(on_kafka_thread, _raise_bare_kafka_error).result(timeout=5)
        # The same (only) thread still runs work: it did not die with the error.
        assert pool.submit(on_kafka_thread, lambda: 41 + 1).result(timeout=5) == 42


class _ClosingConsumer:
    """A consumer in ``close()``: callbacks still run, asking for the assignment raises."""

    def __init__(self) -> None:
        self.callbacks: dict[str, object] = {}

    def subscribe(self, topics: list[str], **callbacks: object) -> None:
        self.callbacks = callbacks

    def incremental_assign(self, parts: list[TopicPartition]) -> None:
        return

    def incremental_unassign(self, parts: list[TopicPartition]) -> None:
        return

    def assignment(self) -> list[TopicPartition]:
        _raise_bare_kafka_error()
        return []


class _Report:
    def __init__(self) -> None:
        self.seen: list[list[tuple[str, int]]] = []

    def assigned(self, assignment: list[tuple[str, int]]) -> None:
        self.seen.append(assignment)


def test_the_assignment_report_follows_the_callbacks_without_asking_the_consumer() -> None:
    topo = topology_of(Settings(partitions=4))
    consumer, report = _ClosingConsumer(), _Report()
    Membership(topo, "fetch").subscribe(consumer, report=report)  # type: ignore[arg-type]
    assign, revoke = consumer.callbacks["on_assign"], consumer.callbacks["on_revoke"]
    assign(consumer, [TopicPartition(topo.frontier, 0), TopicPartition(topo.frontier, 1)])  # type: ignore[operator]
    revoke(consumer, [TopicPartition(topo.frontier, 0)])  # type: ignore[operator]
    assert report.seen == [
        [(topo.frontier, 0), (topo.frontier, 1), (topo.frontier_high, 0),
         (topo.frontier_high, 1)],
        [(topo.frontier, 1), (topo.frontier_high, 1)],
    ]
