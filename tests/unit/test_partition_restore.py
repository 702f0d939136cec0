"""Restore-on-assign, as the runtimes do it (:mod:`streams.partition_restore`), against a
consumer that records its pause/seek/resume calls: no broker needed.

The group's committed offsets (read from the broker in a real restore) are stubbed; the
restores themselves run on the Restorer's thread, as they do in a worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaException,
    Message,
    TopicPartition,
)

import streams.broker_time as broker_time
import streams.partition_restore as partition_restore
from consumers.retry import RetryStage
from core.config import Settings
from infra.topics import topology_of
from schemas.topics import Topology
from streams.async_session import AsyncSession, SessionRole
from streams.batch_stage import BatchStage
from streams.broker_time import BrokerTimeProbe
from streams.control import ControlState
from streams.io import Encoder, Output
from streams.ledger import CommitBatch, Ledger
from streams.partition_restore import TP, RestoreSpec
from streams.restorer import Restored, Restorer
from streams.status import StatusFile
from streams.worker import StopFlag
from tests.unit.test_fetch_revoke import _Msg


class RecordingConsumer:
    """Records pause/seek/resume as librdkafka would apply them; holds no record."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str, int, int]]]] = []
        self.paused: set[tuple[str, int]] = set()
        self.assigned: set[tuple[str, int]] = set()

    def _log(self, what: str, tps: list[TopicPartition]) -> None:
        self.calls.append((what, sorted((tp.topic, tp.partition, tp.offset) for tp in tps)))

    def pause(self, tps: list[TopicPartition]) -> None:
        self._log("pause", tps)
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self._log("resume", tps)
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def seek(self, tp: TopicPartition) -> None:
        self._log("seek", [tp])

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(self.assigned)]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]

    def of(self, what: str) -> list[tuple[str, int, int]]:
        return [tp for w, tps in self.calls if w == what for tp in tps]

    def resumed_before_seek(self) -> bool:
        """Every seek came after its partition's resume: librdkafka answers the offset
        lookup of a logical-offset seek that a later resume overtakes as "outdated" and
        tries again only after its 500 ms back-off."""
        resumed: set[tuple[str, int]] = set()
        for what, tps in self.calls:
            for t, p, _ in tps:
                if what == "resume":
                    resumed.add((t, p))
                elif what == "seek" and (t, p) not in resumed:
                    return False
        return True


class RecordingCommitter:
    def __init__(self) -> None:
        self.offsets: list[dict[TP, int]] = []

    def commit(self, consumer: Any, outputs: list[Output], offsets: list[TopicPartition],
               track: frozenset[str] = frozenset()) -> dict[TP, int]:
        self.offsets.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        return {}


#: The test stage's failed restores are tried again this soon.
RETRY_S = 0.2


class StatefulStage(BatchStage):
    """A batch stage owning state per partition, on the retry stage's inputs (three tiers:
    one lead topic, two followers)."""

    stage = "retry"
    state_restore = RestoreSpec("test-state", retry_s=RETRY_S)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: list[tuple[str, int, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: set[int] = set()
        self.restores_run: list[set[int]] = []
        self.restored_calls: list[tuple[set[int], set[int], Any]] = []
        self.revoked_calls: list[set[int]] = []

    def handle(self, msg: Message) -> list[Output]:
        self.handled.append((msg.topic(), msg.partition(), msg.offset()))  # type: ignore[arg-type]
        return []

    def restore(self, parts: set[int]) -> tuple[set[int], Any]:
        self.gate.wait(5)
        self.restores_run.append(set(parts))
        failed = parts & self.fail
        return failed, {p: f"state of {p}" for p in parts - failed}

    def restored(self, done: Restored, info: Any) -> None:
        self.restored_calls.append((set(done.complete), set(done.failed), info))

    def revoked(self, parts: set[int]) -> None:
        self.revoked_calls.append(set(parts))


class Stateless(BatchStage):
    stage = "parse"

    def handle(self, msg: Message) -> list[Output]:
        return []


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, bootstrap_servers="127.0.0.1:1")


def _settle(restorer: Restorer) -> None:
    """Wait for every restore started so far to return (the next batch then sees it)."""
    concurrent.futures.wait([job.future for job in restorer._jobs], timeout=5)


@pytest.fixture
def committed(monkeypatch: pytest.MonkeyPatch) -> dict[TP, int]:
    """The group's committed offsets, as the stubbed stable read returns them."""
    offsets: dict[TP, int] = {}
    reads: list[list[TP]] = []

    def stable(settings: Settings, group: str,
               partitions: list[TopicPartition]) -> dict[TP, int]:
        reads.append([(tp.topic, tp.partition) for tp in partitions])
        return {(tp.topic, tp.partition): offsets.get((tp.topic, tp.partition), -1001)
                for tp in partitions}

    monkeypatch.setattr(partition_restore, "stable_committed", stable)
    return offsets


def _assign(stage: BatchStage, consumer: RecordingConsumer, parts: list[int]) -> list[TP]:
    """Assign ``parts`` of the lead topic, expanded to the followers as Membership does."""
    tps = stage.membership.expand([TopicPartition(stage.membership.lead, p) for p in parts])
    consumer.assigned |= {(tp.topic, tp.partition) for tp in tps}
    stage._on_assign(consumer, tps)  # type: ignore[arg-type]
    return [(tp.topic, tp.partition) for tp in tps]


def _batch(stage: BatchStage, consumer: RecordingConsumer, msgs: list[_Msg],
           committer: RecordingCommitter | None = None) -> None:
    stage._process(consumer, committer or RecordingCommitter(),  # type: ignore[arg-type]
                   msgs)  # type: ignore[arg-type]


def test_new_partitions_wait_paused_then_resume_from_the_committed_offsets(
        tmp_path: Path, committed: dict[TP, int]) -> None:
    stage = StatefulStage(_settings(tmp_path), "retry-t")
    tiers = stage.topology.retry_topics
    committed[(tiers[0], 1)] = 40
    committed[(tiers[2], 1)] = 7  # tiers[1] partition 1: never committed
    consumer = RecordingConsumer()
    try:
        stage.gate.clear()  # the restore holds until the first batch ran
        inputs = _assign(stage, consumer, [1])
        assert sorted(inputs) == sorted((t, 1) for t in tiers)
        assert consumer.paused == set(inputs)  # paused in the callback, all three tiers
        assert stage.unusable() == set(inputs)
        assert stage.held_partitions() == 1  # one partition number waits

        # Polled before the pause took hold: skipped, to be read again once restored.
        early = [_Msg(tiers[0], 1, 40), _Msg(tiers[2], 1, 7)]
        _batch(stage, consumer, early)
        assert stage.handled == [] and consumer.of("seek") == []
        assert stage.status.gauges["restore_failing"] == 0

        stage.gate.set()
        _settle(stage._restores.restorer)  # type: ignore[union-attr]
        _batch(stage, consumer, early)  # still taken before the restore was collected
        assert stage.handled == []
        assert sorted(consumer.of("seek")) == sorted(
            [(tiers[0], 1, 40), (tiers[1], 1, OFFSET_BEGINNING), (tiers[2], 1, 7)])
        assert sorted(consumer.of("resume")) == sorted((t, 1, -1001) for t in tiers)
        assert consumer.resumed_before_seek()
        assert consumer.paused == set()
        # Seeded with what the group committed (none for the tier never committed): a
        # transaction of own outputs alone carries them, so the broker checks the generation.
        assert stage._committed == {(tiers[0], 1): 40, (tiers[2], 1): 7}
        assert stage.restored_calls == [({1}, set(), {1: "state of 1"})]
        assert stage.status.counters.get("restores") == 1
        assert "restore_failures" not in stage.status.counters
        assert stage.unusable() == set() and stage.held_partitions() == 0

        committer = RecordingCommitter()
        _batch(stage, consumer, early, committer)  # read again: handled now
        assert stage.handled == [(tiers[0], 1, 40), (tiers[2], 1, 7)]
        assert committer.offsets == [{(tiers[0], 1): 41, (tiers[2], 1): 8}]
    finally:
        stage._restores.close()  # type: ignore[union-attr]


def test_committed_offsets_are_read_before_the_state_is_restored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []

    def stable(settings: Settings, group: str,
               partitions: list[TopicPartition]) -> dict[TP, int]:
        order.append("offsets " + ",".join(sorted(f"{tp.topic}:{tp.partition}"
                                                  for tp in partitions)))
        assert group == stage.topology.group("retry")
        return {}

    monkeypatch.setattr(partition_restore, "stable_committed", stable)
    stage = StatefulStage(_settings(tmp_path), "retry-t")
    real_restore = stage.restore

    def restore(parts: set[int]) -> tuple[set[int], Any]:
        order.append("state")
        return real_restore(parts)

    stage.restore = restore  # type: ignore[method-assign]
    try:
        _assign(stage, RecordingConsumer(), [0, 2])
        _settle(stage._restores.restorer)  # type: ignore[union-attr]
        tiers = stage.topology.retry_topics
        assert order == ["offsets " + ",".join(sorted(f"{t}:{p}" for t in tiers
                                                      for p in (0, 2))), "state"]
    finally:
        stage._restores.close()  # type: ignore[union-attr]


def test_a_failed_restore_keeps_its_partition_paused_and_is_retried(
        tmp_path: Path, committed: dict[TP, int], caplog: pytest.LogCaptureFixture) -> None:
    stage = StatefulStage(_settings(tmp_path), "retry-t")
    tiers = stage.topology.retry_topics
    consumer = RecordingConsumer()
    stage.fail = {3}
    try:
        _assign(stage, consumer, [3, 4])
        _settle(stage._restores.restorer)  # type: ignore[union-attr]
        with caplog.at_level(logging.INFO):
            _batch(stage, consumer, [])
        assert {(t, p) for t, p, _ in consumer.of("resume")} == {(t, 4) for t in tiers}
        assert consumer.paused == {(t, 3) for t in tiers}
        assert stage.unusable() == {(t, 3) for t in tiers}
        assert stage.status.counters.get("restores") == 1
        assert stage.status.counters.get("restore_failures") == 1
        assert stage.status.gauges["restore_failing"] == 1
        assert "could not be restored" in caplog.text and "[3]" in caplog.text
        assert stage.restored_calls == [({4}, {3}, {4: "state of 4"})]
        assert 3 not in {p for _, p in stage._committed}

        stage.fail = set()
        _batch(stage, consumer, [])
        assert stage.restores_run == [{3, 4}]  # not before its retry is due
        time.sleep(RETRY_S)
        _batch(stage, consumer, [])  # the retry is due: started again
        _settle(stage._restores.restorer)  # type: ignore[union-attr]
        _batch(stage, consumer, [])
        assert stage.restores_run == [{3, 4}, {3}]
        assert consumer.paused == set() and stage.unusable() == set()
        assert stage.status.gauges["restore_failing"] == 0
        assert stage.status.counters.get("restores") == 2
    finally:
        stage._restores.close()  # type: ignore[union-attr]


def test_a_partition_revoked_while_restoring_never_resumes(
        tmp_path: Path, committed: dict[TP, int]) -> None:
    stage = StatefulStage(_settings(tmp_path), "retry-t")
    consumer = RecordingConsumer()
    try:
        stage.gate.clear()
        _assign(stage, consumer, [5])
        lead = stage.membership.lead
        stage._on_revoke(consumer, stage.membership.expand(  # type: ignore[arg-type]
            [TopicPartition(lead, 5)]))
        assert stage.revoked_calls == [{5}]
        assert stage.unusable() == set() and stage.held_partitions() == 0
        stage.gate.set()
        _settle(stage._restores.restorer)  # type: ignore[union-attr]
        _batch(stage, consumer, [])
        assert consumer.of("seek") == [] and consumer.of("resume") == []
        assert stage.restored_calls == [] and "restores" not in stage.status.counters
    finally:
        stage._restores.close()  # type: ignore[union-attr]


def test_a_stage_without_partition_state_pays_nothing(tmp_path: Path) -> None:
    stage = Stateless(_settings(tmp_path), "parse-t")
    consumer = RecordingConsumer()
    assert stage._restores is None
    _assign(stage, consumer, [0, 1])
    assert consumer.calls == []  # nothing paused: records flow at once
    assert stage.unusable() == set() and stage.held_partitions() == 0
    stage._on_revoke(consumer, [TopicPartition(stage.membership.lead, 0)])  # type: ignore[arg-type]
    _batch(stage, consumer, [])
    assert "restore_failing" not in stage.status.gauges


def test_declaring_state_without_a_restore_fails_at_once(tmp_path: Path) -> None:
    class Forgetful(BatchStage):
        stage = "retry"
        state_restore = RestoreSpec("forgetful")

        def handle(self, msg: Message) -> list[Output]:
            return []

    with pytest.raises(TypeError, match="no restore"):
        Forgetful(_settings(tmp_path), "retry-t")


# --- the retry stage on the runtime ---------------------------------------------------------

def test_retry_resumes_every_tier_where_the_group_committed_with_its_timers_counted(
        tmp_path: Path, committed: dict[TP, int], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def restore(self: RetryStage, parts: set[int]) -> tuple[set[int], Any]:
        # no broker: stubbed (live timers per timer store and partition)
        return {6} & parts, {"timers": {p: 10 + p for p in parts - {6}}}

    monkeypatch.setattr(RetryStage, "restore", restore)
    stage = RetryStage(_settings(tmp_path), "retry-t")
    tiers = stage.topology.retry_topics
    committed[(tiers[1], 2)] = 12
    consumer = RecordingConsumer()
    try:
        _assign(stage, consumer, [2, 6])
        assert stage.held_partitions() == 2
        _settle(stage._restores.restorer)  # type: ignore[union-attr]
        with caplog.at_level(logging.INFO, logger="crawlfleet.stage"):
            stage.begin_batch()  # nothing of its own left before a batch
            stage._use_restored()
        assert sorted(consumer.of("seek")) == sorted(
            [(tiers[0], 2, OFFSET_BEGINNING), (tiers[1], 2, 12), (tiers[2], 2, OFFSET_BEGINNING)])
        assert stage._committed == {(tiers[1], 2): 12}
        assert stage.context is not None and stage.context.usable() == {2}
        assert stage.context.timers_live() == 12
        assert stage.status.gauges["timers"] == 12
        assert stage.status.gauges["restore_failing"] == 1
        assert stage.held_partitions() == 1
        assert stage.unusable() == {(t, 6) for t in tiers}
        assert "retry retry-t: timers of partitions [2] restored in" in caplog.text
        assert ("retry retry-t: timers store of partitions [6] could not be restored; their "
                "inputs stay paused, retried every 10 s") in caplog.text

        stage._on_revoke(consumer, stage.membership.expand(  # type: ignore[arg-type]
            [TopicPartition(tiers[0], 2), TopicPartition(tiers[0], 6)]))
        assert stage.context.usable() == set() and stage.context.timers_live() == 0
        assert stage.status.gauges["timers"] == 0
        assert stage._committed == {} and stage.held_partitions() == 0
    finally:
        stage._restores.close()  # type: ignore[union-attr]
        stage.context.close()  # type: ignore[union-attr]


# --- the fetch stage's runtime --------------------------------------------------------------

class _Logic:
    def __init__(self) -> None:
        self.restored_calls: list[tuple[set[int], Any]] = []

    def restore(self, parts: set[int]) -> tuple[set[int], dict[TP, int], Any]:
        return set(), {}, None

    def restored(self, done: Restored, info: Any) -> None:
        self.restored_calls.append((set(done.complete), info))

    def keep_only(self, owned: set[int]) -> None:
        return None

    def commit_outputs(self) -> list[Output]:
        return []

    def committed(self, batch: CommitBatch, written: dict[TP, int]) -> None:
        return None

    def aborted(self, batch: CommitBatch) -> None:
        return None

    def full(self, paused: bool) -> bool:
        return False

    def tick(self, now: float) -> None:
        return None

    def control_changed(self, state: ControlState) -> None:
        return None

    def members_changed(self, members: int, mine: int, total: int) -> None:
        return None



def _fetch_session(settings: Settings, topo: Topology) -> tuple[
        AsyncSession, RecordingConsumer, Ledger, _Logic, StatusFile]:
    """An asyncio stage's session (call on a running loop) with a recording consumer."""
    status = StatusFile(settings.status_dir, "fetch", "fetch-t")
    ledger, logic = Ledger(), _Logic()
    role = SessionRole(settings, topo, "fetch", "fetch-t", Encoder(topo, "fetch-t"), status,
                       StopFlag())
    session = AsyncSession(role, ledger, logic, frozenset())
    consumer = RecordingConsumer()
    session.consumer = consumer  # type: ignore[assignment]
    return session, consumer, ledger, logic, status


@pytest.mark.parametrize("paused", [False, True])
def test_the_async_session_seeds_its_ledger_and_resumes_only_when_not_paused(
        tmp_path: Path, paused: bool) -> None:
    settings = _settings(tmp_path)
    topo = topology_of(settings)

    async def scenario() -> tuple[RecordingConsumer, Ledger, _Logic, StatusFile]:
        session, consumer, ledger, logic, status = _fetch_session(settings, topo)
        session.paused = paused
        try:
            tps = session.membership.expand([TopicPartition(topo.frontier, 2)])
            consumer.assigned |= {(tp.topic, tp.partition) for tp in tps}  # as Membership does
            session._on_assign(consumer, tps)  # type: ignore[arg-type]
            assert session.restorer.waiting == {2}
            offsets = {(topo.frontier, 2): 30, (topo.frontier_high, 2): -1001}
            session._restored(Restored({2}, set(), (offsets, "info"), 0.5))
        finally:
            session.restores.close()
            session.kx.shutdown(wait=False)
        return consumer, ledger, logic, status

    consumer, ledger, logic, status = asyncio.run(scenario())
    assert consumer.of("pause") == sorted([(topo.frontier, 2, -1001),
                                           (topo.frontier_high, 2, -1001)])
    assert sorted(consumer.of("seek")) == sorted([(topo.frontier, 2, 30),
                                                  (topo.frontier_high, 2, OFFSET_BEGINNING)])
    assert set(ledger.trackers) == {(topo.frontier, 2), (topo.frontier_high, 2)}
    if paused:  # the stage is full: it resumes them itself when it is not
        assert consumer.of("resume") == []
    else:
        assert {(t, p) for t, p, _ in consumer.of("resume")} == {(topo.frontier, 2),
                                                                 (topo.frontier_high, 2)}
        assert consumer.resumed_before_seek()
    assert logic.restored_calls == [({2}, "info")]
    assert status.counters.get("restores") == 1


# --- the broker-time probe ------------------------------------------------------------------

class _Delivered:
    def __init__(self, ts_type: int, ts: int) -> None:
        self._ts = (ts_type, ts)

    def timestamp(self) -> tuple[int, int]:
        return self._ts


class FakeProducer:
    """Delivers at flush: with the timestamp type and error a test gives it."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        FakeProducer.made.append(conf)
        self.sent: list[tuple[str, int, bytes | None, Any]] = []
        self.pending: list[Any] = []
        self.ts_type, self.err, self.undelivered, self.raises = \
            TIMESTAMP_LOG_APPEND_TIME, None, 0, False
        self.flushes: list[float] = []

    def produce(self, topic: str, key: bytes, value: bytes | None, partition: int,
                on_delivery: Any) -> None:
        if self.raises:
            raise KafkaException("queue full")
        assert value is None  # a tombstone
        self.sent.append((topic, partition, key, value))
        self.pending.append(on_delivery)

    def flush(self, timeout: float) -> int:
        self.flushes.append(timeout)
        for cb in self.pending:
            cb(self.err, _Delivered(self.ts_type, 1_700_000_000_123))
        self.pending.clear()
        return self.undelivered


def test_the_broker_time_probe_reports_only_a_delivered_log_append_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(broker_time, "Producer", FakeProducer)
    FakeProducer.made = []
    got: list[int] = []
    logger = logging.getLogger("crawlfleet.test-probe")
    probe = BrokerTimeProbe(_settings(tmp_path), "w-clock", got.append, "test probe", logger)
    probe.close()
    assert FakeProducer.made == []  # no producer until the first probe

    probe.probe("t.timers", 3, b"\x00probe", 10.0)
    assert got == [1_700_000_000_123]
    producer = probe._producer
    assert isinstance(producer, FakeProducer)
    assert producer.sent == [("t.timers", 3, b"\x00probe", None)]
    assert FakeProducer.made[0]["client.id"] == "w-clock"

    producer.ts_type = TIMESTAMP_CREATE_TIME  # a producer's clock: never the broker's
    probe.probe("t.timers", 3, b"\x00probe")
    producer.ts_type, producer.err = TIMESTAMP_LOG_APPEND_TIME, object()
    probe.probe("t.timers", 3, b"\x00probe")
    assert got == [1_700_000_000_123]

    with caplog.at_level(logging.WARNING, logger="crawlfleet.test-probe"):
        producer.err, producer.undelivered = None, 1
        probe.probe("t.timers", 3, b"\x00probe", 10.0)
        producer.raises = True
        probe.probe("t.timers", 3, b"\x00probe")  # swallowed
    assert "test probe not delivered within 10 s" in caplog.text
    assert "test probe failed: " in caplog.text and "queue full" in caplog.text
    assert len(FakeProducer.made) == 1  # one producer for every probe
    probe.close()
    assert producer.flushes[-1] == 5.0


def test_polls_are_short_only_while_a_restore_runs(
        tmp_path: Path, committed: dict[TP, int]) -> None:
    """A finished restore's partitions resume at the next poll: while one runs, the runtime
    polls briefly; idle, or with only a failed restore waiting for its retry, it does not."""
    stage = StatefulStage(_settings(tmp_path), "retry-t")
    consumer = RecordingConsumer()
    restores = stage._restores
    assert restores is not None
    try:
        assert restores.poll_timeout(0.2) == 0.2  # nothing assigned
        stage.gate.clear()  # the restore holds
        _assign(stage, consumer, [1])
        assert restores.poll_timeout(0.2) == partition_restore.RESTORE_POLL_S
        assert restores.poll_timeout(0.01) == 0.01  # never longer than asked
        stage.fail = {1}
        stage.gate.set()
        _settle(restores.restorer)
        _batch(stage, consumer, [])
        assert restores.failing == {1}
        assert restores.poll_timeout(0.2) == 0.2  # a failed one waits for its retry
        stage.fail = set()
        time.sleep(RETRY_S)
        _batch(stage, consumer, [])  # the retry started
        _settle(restores.restorer)
        _batch(stage, consumer, [])
        assert restores.waiting == set() and restores.poll_timeout(0.2) == 0.2
    finally:
        restores.close()


def test_a_restore_finished_after_its_partition_was_revoked_seeks_nothing(
        tmp_path: Path) -> None:
    # librdkafka raises _STATE on a seek of a partition no longer assigned: that ended a
    # fetch worker whose partitions were revoked while their restore ran (full suite).
    settings = _settings(tmp_path)
    topo = topology_of(settings)

    async def scenario() -> tuple[RecordingConsumer, Ledger]:
        session, consumer, ledger, _, _ = _fetch_session(settings, topo)
        try:
            offsets = {(topo.frontier, 2): 30, (topo.frontier_high, 2): -1001}
            # Partition 2 finished restoring, but it is no longer assigned.
            session._restored(Restored({2}, set(), (offsets, "info"), 0.5))
        finally:
            session.restores.close()
            session.kx.shutdown(wait=False)
        return consumer, ledger

    consumer, ledger = asyncio.run(scenario())
    assert consumer.of("seek") == [] and consumer.of("resume") == []
    assert not ledger.trackers
