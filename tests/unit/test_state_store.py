"""The generic changelog-backed StateStore on its own (no broker): format tags, TTL reads and
sweeps, multi-partition writes with their checkpoints, and what a restore applies and counts
(the changelog read itself, ``tail_changelog``, is replaced by a stand-in)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Message, TopicPartition
from rocksdict import Rdict

import streams.state_store as state_store
from core.config import Settings
from streams.state_store import KEY_CHECKPOINT, KEY_FORMAT, KEY_TOPIC, StateStore

TOPIC = "crawl.things"


def _stamped(written_s: float, payload: bytes = b"v") -> bytes:
    """A value of the test's TTL layout: 8 bytes of write time, then the payload."""
    return int(written_s).to_bytes(8, "big") + payload


def _written_of(raw: bytes) -> int | None:
    if len(raw) < 8:
        raise ValueError(f"unreadable {raw!r}")
    written = int.from_bytes(raw[:8], "big")
    return written or None  # 0: never expires


def _ttl_store(directory: Path, ttl_s: float = 3600) -> StateStore:
    return StateStore("things", directory, ttl_s=ttl_s, written_of=_written_of)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    s = _ttl_store(tmp_path / "things")
    yield s
    s.close()


def _db(store: StateStore, partition: int) -> Rdict:
    return store._parts[partition]


# --- layout -----------------------------------------------------------------------------


def test_default_format_tag_is_name_v1_and_another_tag_is_rebuilt(tmp_path: Path) -> None:
    store = StateStore("parked", tmp_path)
    store.open(0)
    assert _db(store, 0).get(KEY_FORMAT) == b"parked-v1"
    store.write([(0, b"k", b"v")], {0: 9})
    store.close()

    same = StateStore("parked", tmp_path)  # same tag: reused, checkpoint and all
    same.open(0)
    assert same.get(0, b"k") == b"v"
    assert same.checkpoint(0) == 9
    same.close()

    other = StateStore("parked", tmp_path, format_tag=b"parked-v2")  # new layout: rebuilt
    try:
        other.open(0)
        assert other.get(0, b"k") is None
        assert other.checkpoint(0) == 0
        assert _db(other, 0).get(KEY_FORMAT) == b"parked-v2"
        assert _db(other, 0).get(KEY_TOPIC) == b""
    finally:
        other.close()


def test_a_ttl_needs_a_way_to_read_write_times(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="written_of"):
        StateStore("things", tmp_path, ttl_s=10)


# --- TTL --------------------------------------------------------------------------------


def test_expired_values_are_hidden_from_get_get_as_and_scan(store: StateStore) -> None:
    now = time.time()
    store.open(0)
    store.write([(0, b"a-old", _stamped(now - 3601)), (0, b"b-new", _stamped(now - 10)),
                 (0, b"c-forever", _stamped(0)), (0, b"d-bad", b"xx")])
    assert store.get(0, b"a-old") is None
    assert store.get(0, b"b-new") == _stamped(now - 10)
    assert store.get(0, b"c-forever") == _stamped(0)  # no write time: never expires
    assert store.get(0, b"d-bad") == b"xx"  # unreadable: a read returns it, a sweep deletes it

    def decode(raw: bytes) -> tuple[bytes, int | None]:
        return raw[8:], _written_of(raw)

    assert store.get_as(0, b"a-old", decode) is None
    assert store.get_as(0, b"b-new", decode) == b"v"
    assert store.get_as(0, b"missing", decode) is None
    assert store.get_as(1, b"b-new", decode) is None  # not an open partition
    assert [k for k, _ in store.scan(0)] == [b"b-new", b"c-forever", b"d-bad"]
    assert [k for k, _ in store.scan(0, limit=1)] == [b"b-new"]
    assert _db(store, 0).get(b"a-old") is not None  # still on disk until a sweep


def test_without_a_ttl_nothing_expires_and_sweep_does_nothing(tmp_path: Path) -> None:
    store = StateStore("things", tmp_path)
    try:
        store.open(0)
        store.write([(0, b"k", _stamped(1))])
        assert store.get(0, b"k") == _stamped(1)
        assert store.sweep() == 0
    finally:
        store.close()


def test_sweep_deletes_expired_a_slice_at_a_time_across_partitions(store: StateStore) -> None:
    now = time.time()
    for p in (0, 1, 2):
        store.open(p)
    store.write([(0, b"a1", _stamped(now - 7200)), (0, b"a2", _stamped(now)),
                 (0, b"a3", _stamped(now - 4000)), (1, b"b1", _stamped(now)),
                 (2, b"c1", _stamped(now - 3601)), (2, b"c2", b"bad")])
    assert store.sweep(budget=2) == 1  # a1 (a2 kept); resumes at a3
    assert _db(store, 0).get(b"a1") is None
    assert store.sweep(budget=2) == 1  # a3, then the end of p0: p1 is next
    assert store.sweep(budget=10) == 0  # p1: nothing expired
    assert store.sweep(budget=10) == 2  # p2: expired and unreadable alike
    assert _db(store, 2).get(b"c1") is None and _db(store, 2).get(b"c2") is None
    assert store.sweep(budget=10) == 0  # round again from p0: nothing left
    assert _db(store, 0).get(b"a2") is not None and _db(store, 1).get(b"b1") is not None
    assert store.checkpoint(0) == 0  # reserved keys are never swept
    assert _db(store, 0).get(KEY_FORMAT) == b"things-v1"


def test_sweep_of_a_dropped_partition_starts_over(store: StateStore) -> None:
    now = time.time()
    store.open(0)
    store.open(1)
    store.write([(0, b"a", _stamped(now)), (0, b"b", _stamped(now)),
                 (1, b"x", _stamped(now - 9999))])
    assert store.sweep(budget=1) == 0  # stops inside p0
    store.drop(0)
    assert store.sweep(budget=1) == 1  # p0 is gone: from the first open partition, p1


# --- writes -----------------------------------------------------------------------------


def test_write_applies_several_partitions_with_their_checkpoints(tmp_path: Path) -> None:
    store = StateStore("things", tmp_path)
    try:
        for p in (0, 1, 2):
            store.open(p)
        assert store.estimate_keys() == 0  # reserved keys are not counted
        store.write([(0, b"k", b"v0"), (1, b"k", b"v1"), (0, b"gone", b"x")])
        store.write([(0, b"gone", None), (1, b"k", b"v1b"), (3, b"k", b"not ours"),
                     (0, KEY_CHECKPOINT, b"\xff" * 8)],  # reserved: refused
                    {0: 41, 1: 7, 3: 9})
        assert store.get(0, b"k") == b"v0" and store.get(0, b"gone") is None
        assert store.get(1, b"k") == b"v1b"
        assert (store.checkpoint(0), store.checkpoint(1), store.checkpoint(2)) == (41, 7, 0)
        assert 3 not in store.partitions()
        store.write([], {0: 40, 2: 5})  # a checkpoint never moves back
        assert (store.checkpoint(0), store.checkpoint(2)) == (41, 5)
        store.advance({1: 8})  # the one-partition forms are the same write
        store.apply(2, [(b"z", b"1"), (b"k", b"2")])
        assert store.checkpoint(1) == 8
        assert store.scan(2) == [(b"k", b"2"), (b"z", b"1")]
    finally:
        store.close()


# --- restore ----------------------------------------------------------------------------


class _Watermarks:
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return (self.low, self.high)


def _msg(partition: int, offset: int, key: bytes | None, value: bytes | None,
         ts_ms: int | None = None) -> Message:
    ts = int(time.time() * 1000) if ts_ms is None else ts_ms
    return Message(topic=TOPIC, partition=partition, offset=offset, key=key, value=value,
                   timestamp=(TIMESTAMP_CREATE_TIME, ts))


Tail = Callable[..., set[int]]


def _fake_tail(batches: list[dict[int, list[Message]]], low: int, high: int,
               incomplete: set[int]) -> tuple[Tail, dict[int, int]]:
    """A ``tail_changelog`` that hands ``batches`` to the store, as polls would."""
    starts: dict[int, int] = {}

    def tail(settings: Settings, name: str, topic: str, partitions: list[int],
             start_of: Callable[[Consumer, int], int],
             apply: Callable[[dict[int, list[Message]], dict[int, int]], None],
             timeout_s: float) -> set[int]:
        for p in partitions:
            starts[p] = start_of(_Watermarks(low, high), p)  # type: ignore[arg-type]
        for records in batches:
            nexts = {p: max(m.offset() or 0 for m in msgs) + 1 for p, msgs in records.items()}
            apply(records, nexts)
        return incomplete & set(partitions)
    return tail, starts


def _transform(msg: Message) -> bytes | None:
    value = msg.value()
    assert isinstance(value, bytes)
    if value == b"garbage":
        return None
    return _stamped(msg.timestamp()[1] // 1000, value)


def test_restore_applies_the_tail_counts_it_and_drops_the_expired(
        store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    old_ms = int((time.time() - 7200) * 1000)
    batches = [
        {0: [_msg(0, 0, b"a", b"1"), _msg(0, 1, b"b", b"2"), _msg(0, 2, b"c", b"3")],
         1: [_msg(1, 0, b"x", b"9")]},
        {0: [_msg(0, 3, b"a", None),  # tombstone: counted
             _msg(0, 4, b"b", b"2b", ts_ms=old_ms),  # past the TTL: deleted, counted
             _msg(0, 5, b"\x00clock-probe", None),  # reserved: skipped
             _msg(0, 6, None, b"no key"),  # skipped
             _msg(0, 7, b"d", b"garbage"),  # unreadable: skipped
             _msg(0, 8, b"e", b"5", ts_ms=0)]},  # no timestamp: never expired by restore
    ]
    tail, starts = _fake_tail(batches, 0, 9, incomplete={1})
    monkeypatch.setattr(state_store, "tail_changelog", tail)
    applied, incomplete = store.restore_partitions(None, TOPIC, [0, 1], _transform,  # type: ignore[arg-type]
                                                   timeout_s=5)
    assert applied == 3 + 1 + 2 + 1  # puts of p0 and p1, tombstone + expired, the untimed put
    assert incomplete == {1}
    assert starts == {0: 0, 1: 0}
    assert store.partitions() == {0}  # the incomplete one is closed, never used partial
    assert store.get(0, b"a") is None and store.get(0, b"b") is None
    assert store.get(0, b"c") == _stamped(int(batches[0][0][2].timestamp()[1] / 1000), b"3")
    assert store.get(0, b"d") is None
    assert store.get(0, b"e") == _stamped(0, b"5")
    assert store.get(0, b"\x00clock-probe") is None
    assert store.checkpoint(0) == 9
    assert _db(store, 0).get(KEY_TOPIC) == TOPIC.encode()

    # Already open: nothing to do. restore() is the same, returning the incomplete ones.
    assert store.restore_partitions(None, TOPIC, [0], _transform) == (0, set())  # type: ignore[arg-type]
    assert store.restore(None, TOPIC, [0, 1], _transform) == {1}  # type: ignore[arg-type]
    assert store.partitions() == {0}


def test_restore_of_a_checkpoint_off_the_log_rebuilds_from_its_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore("things", tmp_path)
    store.open(0)
    store.write([(0, b"stale", b"1")], {0: 50})
    store.drop(0)
    tail, starts = _fake_tail([{0: [_msg(0, 30, b"fresh", b"2")]}], 30, 40, incomplete=set())
    monkeypatch.setattr(state_store, "tail_changelog", tail)
    try:
        assert store.restore_partitions(None, TOPIC, [0], _transform) == (1, set())  # type: ignore[arg-type]
        assert starts == {0: 30}  # checkpoint 50 is past the end 40: wiped, read from 30
        assert store.get(0, b"stale") is None
        assert store.get(0, b"fresh") is not None
        assert store.checkpoint(0) == 31
    finally:
        store.close()


def test_a_checkpoint_of_another_topic_is_rebuilt(tmp_path: Path) -> None:
    store = StateStore("things", tmp_path)
    try:
        store.open(0)
        store.write([(0, b"k", b"v")], {0: 5})
        _db(store, 0).put(KEY_TOPIC, b"crawl.other")
        assert store._start_offset(_Watermarks(0, 40), TOPIC, 0) == 0  # type: ignore[arg-type]
        assert store.get(0, b"k") is None
        assert store._start_offset(_Watermarks(2, 40), TOPIC, 0) == 2  # type: ignore[arg-type]
        store.write([], {0: 7})
        assert store._start_offset(_Watermarks(2, 40), TOPIC, 0) == 7  # type: ignore[arg-type]
    finally:
        store.close()
