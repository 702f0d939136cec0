"""The runtime's timer store on a real RocksDB (no broker): writes reach the store only when
committed, due timers come out in due order, and a keyed store holds one timer per id, its
index rebuilt by a restore from the same changelog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.topics import Topology
from streams import timers
from streams.declared_store import TimerStore
from streams.io import Encoder, Output
from streams.store_open import open_store

TOPO = Topology(prefix="t.")
TOPIC = "t.crawl.timers"


def _job(url: str) -> dict[str, Any]:
    return {"url": url, "target": "a.test", "profile": "default", "depth": 0, "attempt": 1,
            "parent_url": None, "last_error": None, "priority": 0, "meta": {},
            "delay_ms": 0, "pinned": True}


def _store(tmp_path: Path, keyed: bool) -> TimerStore:
    store = TimerStore("due", TOPIC, "CrawlJob", open_store("due", tmp_path / "due"),
                       Encoder(TOPO, "w"), keyed=keyed)
    store.store.open(0)
    return store


def _commit(store: TimerStore) -> dict[int, int]:
    return store.committed({0}, {})


class _Msg:
    """A changelog record as a restore reads it."""

    def __init__(self, out: Output) -> None:
        self._out = out

    def key(self) -> bytes:
        return self._out.key

    def value(self) -> bytes | None:
        return self._out.value

    def headers(self) -> Any:
        return self._out.headers

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._out.partition


@pytest.mark.parametrize("keyed", [False, True])
def test_writes_reach_the_store_only_when_committed(tmp_path: Path, keyed: bool) -> None:
    store = _store(tmp_path, keyed)
    try:
        store.schedule(0, 5_000, b"a", "a.test", _job("http://a.test/1"))
        assert store.due(0, 10_000, 10) == [] and store.count(0) == 0
        assert _commit(store) == {0: 1}
        (key, raw), = store.due(0, 10_000, 10)
        assert timers.parse_key(key) == (5_000, b"a")
        assert store.decode(raw)["url"] == "http://a.test/1"
        store.schedule(0, 6_000, b"b", "a.test", _job("http://a.test/2"))
        store.rolled_back()  # an aborted batch: its timer never existed
        _commit(store)
        assert store.count(0) == 1
    finally:
        store.store.close()


def test_an_unkeyed_store_keeps_a_timer_per_due_time(tmp_path: Path) -> None:
    store = _store(tmp_path, keyed=False)
    try:
        store.schedule(0, 9_000, b"a", "a.test", _job("http://a.test/1"))
        store.schedule(0, 3_000, b"a", "a.test", _job("http://a.test/1"))
        _commit(store)
        assert [timers.due_of(k) for k, _ in store.due(0, 10_000, 10)] == [3_000, 9_000]
    finally:
        store.store.close()


def test_a_keyed_store_moves_an_ids_timer_and_forgets_it_when_fired(tmp_path: Path) -> None:
    store = _store(tmp_path, keyed=True)
    try:
        store.schedule(0, 9_000, b"a", "a.test", _job("http://a.test/1"))
        store.schedule(0, 3_000, b"a", "a.test", _job("http://a.test/1"))  # same batch
        _commit(store)
        assert [timers.due_of(k) for k, _ in store.due(0, 10_000, 10)] == [3_000]
        assert store.count(0) == 1 and store.due_of_id(0, b"a") == 3_000
        moved = store.schedule(0, 7_000, b"a", "a.test", _job("http://a.test/1"))
        assert [o.value is None for o in moved] == [True, False, False]  # old gone, index, new
        assert _commit(store) == {0: 0}
        assert [timers.due_of(k) for k, _ in store.due(0, 10_000, 10)] == [7_000]
        (key, _), = store.due(0, 10_000, 10)
        assert len(store.remove(0, key)) == 2  # the timer and its index entry
        _commit(store)
        assert store.due(0, 10_000, 10) == [] and store.due_of_id(0, b"a") is None
        assert store.cancel(0, b"a") == []
    finally:
        store.store.close()


def test_a_keyed_stores_index_is_restored_from_its_changelog(tmp_path: Path) -> None:
    store = _store(tmp_path, keyed=True)
    try:
        written = store.schedule(0, 4_000, b"a", "a.test", _job("http://a.test/1"))
        kinds = {store.raw_entry(o.key) for o in written}
        assert kinds == {True, False}  # the index entry travels as raw bytes
        restored = {o.key: store.restore_value(_Msg(o)) for o in written}  # type: ignore[arg-type]
        assert restored[timers.index_key(b"a")] == timers.encode_due(4_000)
        assert store.decode(restored[timers.timer_key(4_000, b"a")])["url"] == \
            "http://a.test/1"
    finally:
        store.store.close()
