"""Parked per-target queues on a real local StateStore (RocksDB), no broker."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.fetch.parking import ParkedQueues, park_key, share_of, target_of_key
from schemas.topics import partition_for
from tests.unit.conftest import PARKED_PARTS

PARTS = PARKED_PARTS


def _job(target: str, i: int, priority: int = 0) -> dict[str, Any]:
    return {"url": f"http://{target}/{i}", "target": target, "profile": "default",
            "attempt": 0, "priority": priority, "meta": {}}


@pytest.fixture
def queues(parked_queues: ParkedQueues) -> ParkedQueues:
    return parked_queues


def _park(q: ParkedQueues, target: str, offsets: range, tier: int = 0) -> None:
    part = partition_for(target, PARTS)
    changes = [q.park(part, park_key(target, tier, o), _job(target, o, tier)) for o in offsets]
    q.committed(changes)


def test_keys_sort_by_target_then_high_tier_then_offset() -> None:
    keys = [park_key("b", 0, 1), park_key("a", 0, 300), park_key("a", 1, 900),
            park_key("a", 0, 2)]
    assert sorted(keys) == [park_key("a", 1, 900), park_key("a", 0, 2), park_key("a", 0, 300),
                            park_key("b", 0, 1)]
    assert target_of_key(park_key("example.org", 1, 5)) == "example.org"


def test_pending_parks_keep_order_until_committed(queues: ParkedQueues) -> None:
    part = partition_for("a", PARTS)
    change = queues.park(part, park_key("a", 0, 1), _job("a", 1))
    assert queues.must_park("a", 0)  # a later arrival must go behind it
    assert queues.available("a") == 0  # not committed: nothing to take yet
    assert queues.total() == 1
    assert queues.committed([change]) == {"a"}
    assert queues.available("a") == 1


def test_aborted_parks_are_forgotten(queues: ParkedQueues) -> None:
    change = queues.park(0, park_key("a", 0, 1), _job("a", 1))
    queues.aborted([change])
    assert not queues.must_park("a", 0) and queues.total() == 0


def test_take_returns_the_oldest_in_order_and_skips_taken(queues: ParkedQueues) -> None:
    _park(queues, "a", range(10))
    part = partition_for("a", PARTS)
    first = queues.take(part, "a", 0, 3)
    assert [j["url"] for _, j in first] == [f"http://a/{i}" for i in range(3)]
    second = queues.take(part, "a", 0, 3)
    assert [j["url"] for _, j in second] == [f"http://a/{i}" for i in range(3, 6)]
    assert queues.available("a") == 4
    queues.untake(first[1][0])  # went back to disk: it comes out again, first
    assert [j["url"] for _, j in queues.take(part, "a", 0, 2)] == ["http://a/1", "http://a/6"]


def test_tombstones_remove_entries_for_good(queues: ParkedQueues) -> None:
    _park(queues, "a", range(3))
    part = partition_for("a", PARTS)
    taken = queues.take(part, "a", 0, 3)
    queues.committed([(part, k, None) for k, _ in taken])
    assert queues.available("a") == 0 and queues.total() == 0
    assert not queues.must_park("a", 0)
    assert queues.store.scan(part) == []


def test_tiers_are_separate_queues(queues: ParkedQueues) -> None:
    _park(queues, "a", range(100), tier=1)
    part = partition_for("a", PARTS)
    assert queues.must_park("a", 1) and not queues.must_park("a", 0)  # bulk need not wait
    _park(queues, "a", range(100, 110), tier=0)
    assert queues.available("a", 1) == 100 and queues.available("a", 0) == 10
    assert queues.available("a") == 110
    assert {j["priority"] for _, j in queues.take(part, "a", 1, 5)} == {1}
    assert [j["url"] for _, j in queues.take(part, "a", 0, 2)] == ["http://a/100",
                                                                   "http://a/101"]
    assert queues.take(part, "a", 0, 0) == []


def test_restored_partition_is_counted_and_dropped_one_is_forgotten(
        queues: ParkedQueues) -> None:
    _park(queues, "a", range(5))
    part = partition_for("a", PARTS)
    fresh = ParkedQueues(queues.store, PARTS)  # a new session over the same store
    assert fresh.restored(part) == ["a"]
    assert fresh.available("a") == 5
    fresh.dropped(part)
    assert fresh.available("a") == 0 and fresh.total() == 0


def test_commits_for_a_partition_no_longer_owned_are_ignored(queues: ParkedQueues) -> None:
    part = partition_for("a", PARTS)
    change = queues.park(part, park_key("a", 0, 1), _job("a", 1))
    queues.store.drop(part)
    queues.dropped(part)
    assert queues.committed([change]) == set()
    assert queues.total() == 0


@pytest.mark.parametrize(("rate", "expected"), [(2.0, 8 + 8 + 10), (0.1, 8 + 8 + 1),
                                                (1e6, 2500), (float("inf"), 2500)])
def test_share_is_seconds_of_work_plus_floor_capped(rate: float, expected: int) -> None:
    assert share_of(rate, 5.0, 8, 8, 2500) == expected


def test_a_replayed_park_of_a_stored_key_is_counted_once(queues: ParkedQueues) -> None:
    _park(queues, "a", range(3))
    _park(queues, "a", range(3))  # the same frontier records, replayed after a crash
    assert queues.available("a", 0) == 3 and queues.total() == 3
    assert queues.backlog_changes() == {partition_for("a", PARTS): 3}
    part = partition_for("a", PARTS)
    key = park_key("a", 0, 0)
    # park then tombstone of one key in one batch, and a tombstone of a key never stored
    queues.committed([queues.park(part, park_key("a", 0, 9), _job("a", 9)),
                      (part, park_key("a", 0, 9), None), (part, park_key("a", 0, 77), None),
                      (part, key, None)])
    assert queues.available("a", 0) == 2 and queues.total() == 2
    assert queues.backlog_changes() == {part: 2}


def test_waiting_targets_are_those_with_committed_entries_not_in_memory(
        queues: ParkedQueues) -> None:
    """What the fetch stage's refill sweep walks: a target whose parked work is all taken,
    or only pending, has nothing a refill could take."""
    _park(queues, "a", range(3))
    _park(queues, "b", range(2), tier=1)
    queues.park(partition_for("c", PARTS), park_key("c", 0, 1), _job("c", 1))  # pending
    assert queues.waiting_targets() == {"a", "b"}
    taken = queues.take(partition_for("b", PARTS), "b", 1, 10)
    assert len(taken) == 2
    assert queues.waiting_targets() == {"a"}
    for key, _ in taken:
        queues.untake(key)  # back to disk (a shed): a refill can take it again
    assert queues.waiting_targets() == {"a", "b"}
