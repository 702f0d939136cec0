"""SeenStore restore against the real broker: checkpoint + changelog tail = committed state.

Records go to one ``crawl.seen`` partition through a real transactional producer; aborted
transactions and tombstones are part of the log, and the store is compared with the state a
``read_committed`` reader of the whole partition sees.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from consumers.fetch.seen import DEAD, DONE, RETRYING, SeenStore
from core.config import Settings
from infra.topics import create_topics, topology_of
from schemas.codec import default_codec
from schemas.keys import dedupe_key
from streams.io import Encoder, producer_conf, raw_value

pytestmark = pytest.mark.integration

TARGET = "127.0.0.2:18080"
OTHER_TARGET = "127.0.0.3:18080"
State = tuple[str, int] | None


def _key(i: int | str, target: str = TARGET) -> str:
    return dedupe_key("default", f"http://{target}/path/{i}?q={i}")


class Changelog:
    """A transactional producer of Seen records for the test's topic."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topology = topology_of(settings)
        self.topic = self.topology.seen
        self.enc = Encoder(self.topology, "test")
        self.producer = Producer(producer_conf(settings, "seen-test",
                                               f"seen-test-{uuid.uuid4().hex[:8]}"))
        self.producer.init_transactions(30)

    def partition(self, target: str = TARGET) -> int:
        return self.enc.record(self.topic, target, b"k", None).partition

    def txn(self, items: Sequence[tuple[str, State]], commit: bool = True,
            target: str = TARGET) -> None:
        self.producer.begin_transaction()
        for key, state in items:
            value = None if state is None else {"state": state[0], "attempt": state[1],
                                                "status": 0}
            o = self.enc.record(self.topic, target, key.encode(), value)
            self.producer.produce(o.topic, value=o.value, key=o.key, partition=o.partition,
                                  headers=o.headers)
        if commit:
            self.producer.commit_transaction(30)
        else:
            self.producer.flush(30)  # the records reach the log, then the abort marker
            self.producer.abort_transaction(30)

    def committed(self, partition: int) -> dict[str, tuple[str, int]]:
        """The partition's committed state as a read_committed reader of all of it sees."""
        consumer = Consumer({**self.settings.kafka_common(), "group.id": "seen-test-ref",
                             "isolation.level": "read_committed",
                             "enable.partition.eof": True, "enable.auto.commit": False})
        state: dict[str, tuple[str, int]] = {}
        codec = default_codec()
        try:
            consumer.assign([TopicPartition(self.topic, partition, 0)])
            while True:
                msgs = consumer.consume(1000, 5.0)
                assert msgs, "reference read timed out"
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        assert err.code() == KafkaError._PARTITION_EOF, err
                        return state
                    raw_key = msg.key()
                    assert isinstance(raw_key, bytes)
                    value = raw_value(msg)
                    if value is None:
                        state.pop(raw_key.decode(), None)
                    else:
                        rec = codec.decode("Seen", value, msg.headers())
                        state[raw_key.decode()] = (rec["state"], rec["attempt"])
        finally:
            consumer.close()

    def high(self, partition: int) -> int:
        consumer = Consumer({**self.settings.kafka_common(), "group.id": "seen-test-wm"})
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                      timeout=10)[1])
        finally:
            consumer.close()


@pytest.fixture
def log_(settings: Settings) -> Changelog:
    create_topics(settings)
    return Changelog(settings)


def _assert_matches(store: SeenStore, partition: int, expected: dict[str, tuple[str, int]],
                    absent: list[str]) -> None:
    got = {k: store.get(partition, k) for k in expected}
    assert got == expected
    for k in absent:
        assert store.get(partition, k) is None, k


def test_restore_reads_only_the_tail_after_the_checkpoint(settings: Settings, log_: Changelog,
                                                          tmp_path: Path) -> None:
    p = log_.partition()
    codec = log_.enc.codec
    first = [(_key(i), (DONE, 0)) for i in range(40)]
    log_.txn(first[:20])
    log_.txn([*first[20:], (_key(3), (RETRYING, 1)), (_key(3), (DEAD, 2))])  # last write wins
    other_p = log_.partition(OTHER_TARGET)
    assert other_p != p
    log_.txn([(_key("x", OTHER_TARGET), (DONE, 0))], target=OTHER_TARGET)

    store = SeenStore.at(tmp_path / "seen" / "w1")
    try:
        n = store.restore(settings, log_.topic, [p], codec, timeout_s=60)
        assert n == 42
        assert store.partitions() == {p}
        assert store.checkpoint(p) == log_.high(p)
        assert store.get(p, _key(3)) == (DEAD, 2)
        _assert_matches(store, p, log_.committed(p), [_key("x", OTHER_TARGET)])
        assert store.restore(settings, log_.topic, [p], codec) == 0  # already open: no-op

        # The fetch stage commits its own writes, then applies them with put_many.
        ours = [(_key(f"own{i}"), (RETRYING, 1)) for i in range(5)]
        log_.txn(ours)
        store.put_many((p, k, s[0], s[1]) for k, s in ours if s is not None)

        # Meanwhile (or under another owner) more history: new keys, an update, a tombstone,
        # an aborted transaction that touches a new key and an existing one, then more commits.
        more: list[tuple[str, State]] = [(_key(f"new{i}"), (DONE, 0)) for i in range(10)]
        more += [(_key(0), (RETRYING, 2)), (_key(1), None)]
        log_.txn(more)
        log_.txn([(_key("aborted"), (DONE, 0)), (_key(2), (DEAD, 9))], commit=False)
        after = [(_key("after-abort"), (DONE, 1))]
        log_.txn(after)
        store.drop(p)
        assert store.partitions() == set()

        n = store.restore(settings, log_.topic, [p], codec, timeout_s=60)
        assert n == len(ours) + len(more) + len(after)  # the tail only, aborted excluded
        assert store.checkpoint(p) == log_.high(p)  # past the abort marker too
        assert store.get(p, _key("aborted")) is None
        assert store.get(p, _key(2)) == (DONE, 0)  # the aborted overwrite never applied
        assert store.get(p, _key(1)) is None  # tombstoned
        assert store.get(p, _key(0)) == (RETRYING, 2)
        expected = log_.committed(p)
        assert len(expected) == 40 - 1 + 5 + 10 + 1
        _assert_matches(store, p, expected, [_key(1), _key("aborted")])
    finally:
        store.close()


_CRASHING_WORKER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from confluent_kafka import Producer
    from streams.io import Encoder, producer_conf
    from infra.topics import topology_of
    from consumers.fetch.seen import SeenStore
    from core.config import load_settings

    bootstrap, prefix, directory, partition, target = sys.argv[1:6]
    s = load_settings(bootstrap_servers=bootstrap, topic_prefix=prefix, partitions=4,
                      allow_private=True)
    topo = topology_of(s)
    enc = Encoder(topo, "crash")
    store = SeenStore.at(Path(directory))
    p = int(partition)
    store.restore(s, topo.seen, [p], enc.codec, timeout_s=60)
    store.drop(p)                      # revoked: files (checkpoint) kept
    store.restore(s, topo.seen, [p], enc.codec, timeout_s=60)
    prod = Producer(producer_conf(s, "crash", "seen-test-crash"))
    prod.init_transactions(30)
    prod.begin_transaction()
    items = [(f"default|http://{target}/crash/{i}", "DONE", i % 3) for i in range(25)]
    for key, state, attempt in items:
        o = enc.record(topo.seen, target, key.encode(),
                       {"state": state, "attempt": attempt, "status": 0})
        prod.produce(o.topic, value=o.value, key=o.key, partition=o.partition,
                     headers=o.headers)
    prod.commit_transaction(30)
    store.put_many((p, k, st, a) for k, st, a in items)   # applied only after the commit
    print(len(store), flush=True)
    os._exit(9)                        # crash: no close, no flush of the memtable
""")


def test_restore_after_crash_converges_to_committed_state(settings: Settings, log_: Changelog,
                                                          tmp_path: Path) -> None:
    p = log_.partition()
    codec = log_.enc.codec
    log_.txn([(_key(i), (DONE, 0)) for i in range(30)])
    directory = tmp_path / "seen" / "w1"
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_WORKER, settings.bootstrap_servers,
         settings.topic_prefix, str(directory), str(p), TARGET],
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 9, proc.stderr
    assert int(proc.stdout.split()[-1]) >= 30

    # While the crashed worker is gone, the next owner's history continues.
    log_.txn([(f"default|http://{TARGET}/crash/0", None), (_key(5), (DEAD, 3)),
              (_key("late"), (RETRYING, 1))])
    log_.txn([(_key(6), (DONE, 7))], commit=False)

    store = SeenStore.at(directory)
    try:
        n = store.restore(settings, log_.topic, [p], codec, timeout_s=60)
        # From the checkpoint the crashed worker had persisted (its drop flushed it): its own
        # 25 committed writes are replayed from the changelog, then the 3 later records.
        assert n == 25 + 3
        expected = log_.committed(p)
        assert len(expected) == 30 + 24 + 1
        _assert_matches(store, p, expected, [f"default|http://{TARGET}/crash/0"])
        assert store.get(p, _key(6)) == (DONE, 0)
    finally:
        store.close()


def test_checkpoint_of_another_log_is_rebuilt(settings: Settings, log_: Changelog,
                                              tmp_path: Path) -> None:
    """A DB restored from one log (e.g. a topic since deleted and recreated) is not reused."""
    p = log_.partition()
    codec = log_.enc.codec
    log_.txn([(_key(i), (DONE, 0)) for i in range(20)])
    directory = tmp_path / "seen" / "w1"
    store = SeenStore.at(directory)
    assert store.restore(settings, log_.topic, [p], codec, timeout_s=60) == 20
    store.close()

    other = settings.replace(topic_prefix=f"t{uuid.uuid4().hex[:10]}.")
    create_topics(other)
    log2 = Changelog(other)
    assert log2.partition() == p
    log2.txn([(_key("only-here"), (DEAD, 1))])
    store = SeenStore.at(directory)
    try:
        assert store.restore(other, log2.topic, [p], codec, timeout_s=60) == 1
        assert store.get(p, _key("only-here")) == (DEAD, 1)
        assert store.get(p, _key(0)) is None  # the other log's keys were wiped
        assert store.checkpoint(p) == log2.high(p)
    finally:
        store.close()
