"""Restorer on its own: restores run off the caller's thread; only live partitions resume."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import TopicPartition

from schemas.topics import Topology
from streams.membership import Membership
from streams.restorer import Restored, Restorer


def _wait(restorer: Restorer, now: float | None = None, timeout: float = 5.0) -> list[Restored]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = restorer.finished(now)
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("no restore finished")


def test_restores_run_off_the_calling_thread_and_complete() -> None:
    threads: list[str] = []

    def restore(parts: set[int]) -> tuple[set[int], Any]:
        threads.append(threading.current_thread().name)
        return set(), sorted(parts)

    r = Restorer("t", restore)
    try:
        r.start({1, 2})
        assert r.waiting == {1, 2}
        done = _wait(r)
        assert [(d.complete, d.failed, d.payload) for d in done] == [({1, 2}, set(), [1, 2])]
        assert r.waiting == set()
        assert threads and threads[0] != threading.current_thread().name
    finally:
        r.close()


def test_a_revoked_partition_never_resumes_from_a_restore_started_before() -> None:
    gate = threading.Event()

    def restore(parts: set[int]) -> tuple[set[int], Any]:
        gate.wait(5)
        return set(), None

    r = Restorer("t", restore)
    try:
        r.start({1, 2})
        r.cancel({2})  # revoked while its restore runs
        gate.set()
        done = _wait(r)
        assert done[0].complete == {1}
        assert r.waiting == set()
        r.start({2})  # assigned again: a new restore, whose result counts
        assert _wait(r)[0].complete == {2}
    finally:
        r.close()


def test_a_failed_restore_keeps_its_partition_waiting_and_is_retried() -> None:
    calls: list[set[int]] = []

    def restore(parts: set[int]) -> tuple[set[int], Any]:
        calls.append(set(parts))
        if len(calls) == 1:
            return {3}, None  # 3 could not reach the changelog's end
        if len(calls) == 2:
            raise RuntimeError("broker went away")  # an exception is a failure too
        return set(), None

    r = Restorer("t", restore, retry_s=60.0)
    try:
        r.start({3, 4})
        first = _wait(r)
        assert (first[0].complete, first[0].failed) == ({4}, {3})
        assert r.waiting == {3} and r.failing == {3}
        assert r.finished() == [] and calls == [{3, 4}]  # not before its retry is due
        later = time.monotonic() + 61
        assert r.finished(later) == []  # due: started again
        second = _wait(r, later)  # it raised
        assert second[0].failed == {3} and "broker went away" in second[0].error
        assert r.finished(later + 61) == []
        third = _wait(r, later + 61)
        assert third[0].complete == {3}
        assert r.waiting == set() and r.failing == set()
        assert calls == [{3, 4}, {3}, {3}]
    finally:
        r.close()


def test_followers_are_assigned_with_their_lead_partition() -> None:
    topo = Topology(prefix="p.")
    fetch = Membership(topo, "fetch")
    got = fetch.expand([TopicPartition(topo.frontier, 2), TopicPartition(topo.frontier, 5)])
    assert sorted((tp.topic, tp.partition) for tp in got) == sorted(
        [(topo.frontier, 2), (topo.frontier, 5), (topo.frontier_high, 2),
         (topo.frontier_high, 5)])
    retry = Membership(topo, "retry")
    assert len(retry.expand([TopicPartition(topo.retry_topics[0], 0)])) == len(topo.retry_topics)
    assert Membership(topo, "store").expand([TopicPartition(topo.parsed, 1)])[0].topic == \
        topo.parsed
