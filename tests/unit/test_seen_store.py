"""SeenStore on its own (no broker): RocksDB per partition, compact values, files kept on drop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

from consumers.fetch.seen import (
    DEAD,
    DONE,
    RETRYING,
    SeenStore,
    decode_entry,
    decode_value,
    encode_value,
    restored_value,
)
from core.config import Settings
from core.errors import InfraError
from schemas.codec import Codec, default_codec
from streams import state_store
from streams.state_store import KEY_CHECKPOINT, KEY_FORMAT


@pytest.mark.parametrize("state", [DONE, RETRYING, DEAD])
@pytest.mark.parametrize("attempt", [0, 1, 2, 3, 63, 64, 127, 128, 300, 2**31 - 1, -1, -2**31,
                                     2**63 - 1, -2**63])
def test_value_codec_round_trip(state: str, attempt: int) -> None:
    raw = encode_value(state, attempt)
    assert decode_value(raw) == (state, attempt)


def test_value_codec_is_compact() -> None:
    assert encode_value(DONE, 0) == b"\x00\x00"
    assert len(encode_value(RETRYING, 2)) == 2
    assert len(encode_value(DEAD, 63)) == 2
    assert len(encode_value(DEAD, 64)) == 3


@pytest.mark.parametrize("raw", [b"", b"\x03\x00", b"\x00", b"\x00\x80", b"\x00\x00\x80",
                                 b"\x00\x00\x00\x00"])
def test_value_codec_rejects_corrupt(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_value(raw)


def test_value_codec_rejects_unknown_state() -> None:
    with pytest.raises(ValueError):
        encode_value("MAYBE", 0)
    with pytest.raises(ValueError):
        encode_value(DONE, 2**63)


def test_put_get_and_closed_partitions_ignored(tmp_path: Path) -> None:
    store = SeenStore.at(tmp_path / "seen")
    try:
        store.open(0)
        store.open(3)
        assert store.partitions() == {0, 3}
        store.put_many([
            (0, "default|http://a.test/x", DONE, 0),
            (3, "default|http://b.test/ü?q=1", RETRYING, 2),
            (1, "default|http://c.test/", DONE, 0),  # partition 1 is not open: ignored
        ])
        assert store.get(0, "default|http://a.test/x") == (DONE, 0)
        assert store.get(3, "default|http://b.test/ü?q=1") == (RETRYING, 2)
        assert store.get(1, "default|http://c.test/") is None
        assert store.get(3, "default|http://a.test/x") is None  # partitions are separate
        assert store.get(2, "anything") is None
        store.put_many([(3, "default|http://b.test/ü?q=1", DEAD, 3)])  # last write wins
        assert store.get(3, "default|http://b.test/ü?q=1") == (DEAD, 3)
        assert not (tmp_path / "seen" / "p1").exists()
    finally:
        store.close()


def test_reserved_keys_never_collide(tmp_path: Path) -> None:
    store = SeenStore.at(tmp_path)
    try:
        store.open(0)
        assert store.checkpoint(0) == 0
        store.put_many([(0, KEY_CHECKPOINT.decode(), DONE, 7)])  # refused, not stored
        assert store.get(0, KEY_CHECKPOINT.decode()) is None
        assert store.checkpoint(0) == 0
    finally:
        store.close()


def test_drop_then_reopen_keeps_data_on_disk(tmp_path: Path) -> None:
    directory = tmp_path / "seen" / "w1"
    store = SeenStore.at(directory)
    store.open(5)
    store.put_many((5, f"default|http://h.test/{i}", DONE, i % 3) for i in range(1000))
    store.drop(5)
    assert store.partitions() == set()
    assert store.get(5, "default|http://h.test/1") is None  # dropped: not ours any more
    assert (directory / "p5").is_dir()
    store.put_many([(5, "default|http://h.test/late", DONE, 0)])  # after drop: ignored
    store.open(5)
    assert store.get(5, "default|http://h.test/1") == (DONE, 1)
    assert store.get(5, "default|http://h.test/999") == (DONE, 0)
    assert store.get(5, "default|http://h.test/late") is None
    store.close()

    again = SeenStore.at(directory)  # a new store (next membership / process) on the same files
    try:
        again.open(5)
        assert again.get(5, "default|http://h.test/500") == (DONE, 2)
    finally:
        again.close()
    assert (directory / "p5").is_dir()  # a store with its own directory keeps its files


def test_len_estimates_key_count(tmp_path: Path) -> None:
    store = SeenStore.at(tmp_path)
    try:
        assert len(store) == 0
        store.open(0)
        store.open(1)
        assert len(store) == 0  # reserved keys are not counted
        store.put_many((i % 2, f"default|http://h.test/{i}", DONE, 0) for i in range(5000))
        assert 4500 <= len(store) <= 5500
        store.drop(1)
        assert 2000 <= len(store) <= 3000
    finally:
        store.close()


def test_temp_directory_removed_on_close() -> None:
    store = SeenStore.at()
    directory = store.directory
    store.open(0)
    store.put_many([(0, "p|http://x.test/", DONE, 0)])
    assert directory.is_dir()
    store.close()
    assert not directory.exists()
    assert store.partitions() == set()


def test_one_directory_one_owner(tmp_path: Path) -> None:
    first, second = SeenStore.at(tmp_path), SeenStore.at(tmp_path)
    try:
        first.open(0)
        with pytest.raises(InfraError, match="same worker id"):
            second.open(0)
        assert second.partitions() == set()
        first.drop(0)
        second.open(0)  # the files are free again once the owner closed them
    finally:
        first.close()
        second.close()


def test_value_carries_its_write_time() -> None:
    raw = encode_value(RETRYING, 3, 1_796_000_000)
    assert decode_entry(raw) == (RETRYING, 3, 1_796_000_000)
    assert decode_value(raw) == (RETRYING, 3)
    assert decode_entry(encode_value(DONE, 0)) == (DONE, 0, None)  # no time: never expires


def _age(store: SeenStore, partition: int, key: str, seconds: float) -> None:
    """Rewrite a stored entry as if it had been written ``seconds`` ago."""
    state, attempt = store.get(partition, key) or (DONE, 0)
    db = store.store._parts[partition]
    db.put(key.encode(), encode_value(state, attempt, int(time.time() - seconds)))


def test_keys_expire_after_the_ttl_and_a_sweep_deletes_them(tmp_path: Path) -> None:
    """The changelog forgets a key after its retention: so does the local store."""
    store = SeenStore.at(tmp_path, ttl_s=3600)
    try:
        store.open(0)
        store.open(1)
        store.put_many([(0, "d|http://a.test/old", DONE, 0), (0, "d|http://a.test/new", DONE, 0),
                        (1, "d|http://b.test/old", DEAD, 1)])
        _age(store, 0, "d|http://a.test/old", 3601)
        _age(store, 1, "d|http://b.test/old", 7200)
        assert store.get(0, "d|http://a.test/old") is None  # expired: read as never seen
        assert store.get(1, "d|http://b.test/old") is None
        assert store.get(0, "d|http://a.test/new") == (DONE, 0)
        deleted = sum(store.sweep(budget=1) for _ in range(10))  # a slice at a time
        assert deleted == 2
        assert store.store._parts[0].get(b"d|http://a.test/old") is None  # the disk is given back
        assert store.store._parts[0].get(b"d|http://a.test/new") is not None
        assert store.sweep() == 0
    finally:
        store.close()


def test_put_many_moves_the_checkpoint_past_applied_writes(tmp_path: Path) -> None:
    store = SeenStore.at(tmp_path)
    try:
        store.open(0)
        store.open(2)
        assert store.checkpoint(0) == 0
        store.put_many([(0, "d|http://a.test/", DONE, 0)], {0: 41, 5: 9})  # 5 is not ours
        assert store.checkpoint(0) == 41
        assert store.checkpoint(2) == 0
        assert 5 not in store.partitions()
    finally:
        store.close()


def test_on_disk_layout_stays_seen_v2(tmp_path: Path) -> None:
    """Stores written before seen moved onto StateStore carry ``seen-v2``: kept, not wiped."""
    store = SeenStore.at(tmp_path)
    try:
        store.open(0)
        assert store.store._parts[0].get(KEY_FORMAT) == b"seen-v2"
        assert store.path_of(0) == tmp_path / "p0"
        assert store.directory == tmp_path
        assert store.ttl_s is None
    finally:
        store.close()


def _seen_record(codec: Codec, key: str, state: str | None, attempt: int = 0,
                 ts_s: float | None = None) -> Message:
    value, headers = (None, None) if state is None else \
        codec.encode("Seen", {"state": state, "attempt": attempt, "status": 0})
    ts = int((time.time() if ts_s is None else ts_s) * 1000)
    return Message(topic="crawl.seen", partition=0, offset=0, key=key.encode(), value=value,
                   headers=headers, timestamp=(TIMESTAMP_CREATE_TIME, ts))


def test_restore_transform_decodes_seen_and_stamps_the_record_time() -> None:
    codec = default_codec()
    transform = restored_value(codec)
    raw = transform(_seen_record(codec, "d|http://a.test/", RETRYING, 2, ts_s=1_796_000_000.5))
    assert raw is not None and decode_entry(raw) == (RETRYING, 2, 1_796_000_000)
    untimed = _seen_record(codec, "d|http://a.test/", DONE, ts_s=0)
    assert decode_entry(transform(untimed) or b"") == (DONE, 0, None)
    garbage = Message(topic="crawl.seen", partition=0, offset=0, key=b"k", value=b"\xff\xff",
                      headers=[("schema", b"nope")], timestamp=(TIMESTAMP_CREATE_TIME, 1))
    assert transform(garbage) is None  # skipped (with a log line), never a crash loop


def test_restore_counts_applied_records_and_expires_old_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = default_codec()
    records = [_seen_record(codec, "d|http://a.test/1", DONE),
               _seen_record(codec, "d|http://a.test/2", DEAD, 3),
               _seen_record(codec, "d|http://a.test/old", DONE, ts_s=time.time() - 7200),
               _seen_record(codec, "d|http://a.test/1", None)]

    def tail(settings: Settings, name: str, topic: str, partitions: list[int],
             start_of: Any, apply: Any, timeout_s: float) -> set[int]:
        assert name == "seen"
        apply({0: records}, {0: 4})
        return set()

    monkeypatch.setattr(state_store, "tail_changelog", tail)
    store = SeenStore.at(tmp_path, ttl_s=3600)
    try:
        assert store.restore_partitions(None, "crawl.seen", [0], codec) == (4, set())  # type: ignore[arg-type]
        assert store.get(0, "d|http://a.test/1") is None  # tombstoned
        assert store.get(0, "d|http://a.test/2") == (DEAD, 3)
        assert store.store._parts[0].get(b"d|http://a.test/old") is None  # past the TTL
        assert store.checkpoint(0) == 4
        assert store.restore(None, "crawl.seen", [0], codec) == 0  # type: ignore[arg-type]
    finally:
        store.close()
