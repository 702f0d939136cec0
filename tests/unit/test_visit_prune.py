"""Pruning earlier visits' dedupe keys (issue 45): which keys a revisit drops, and when.

The rule (``consumers.fetch.visit_prune``) on its own, then driven through many visits as the
fetch stage drives it (a dict for the seen store, the clock given), then the two parts that
carry a drop to the stores: the ledger (a drop stays in force until its transaction commits)
and the seen store (a committed drop deletes the key).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from consumers.fetch.seen import DONE, SeenStore
from consumers.fetch.visit_prune import prunable_visits
from core.config import Settings
from schemas.keys import job_dedupe_key, visit_key
from schemas.stages import all_specs
from schemas.topics import Topology
from streams.io import Output
from streams.ledger import Ledger, Pending

H = 100.0  # the dedupe horizon of these tests (s)


def _at(times: dict[int, float]) -> Any:
    return times.get


def test_keys_older_than_the_horizon_go_younger_ones_stay() -> None:
    assert prunable_visits(5, _at({4: 0.0, 3: -50.0}), now_s=H + 1, horizon_s=H) == [4, 3]
    assert prunable_visits(5, _at({4: 10.0, 3: 0.0}), now_s=H + 5, horizon_s=H) == [3]
    assert prunable_visits(5, _at({4: 10.0}), now_s=H + 10, horizon_s=H) == []  # not older


def test_visit_zero_is_never_dropped() -> None:
    """Its key keeps a link to the page from starting it again as a new page."""
    assert prunable_visits(1, _at({0: 0.0}), now_s=10 * H, horizon_s=H) == []
    assert prunable_visits(3, _at({0: 0.0, 1: 0.0, 2: 0.0}), now_s=10 * H,
                           horizon_s=H) == [2, 1]


def test_the_walk_stops_at_a_visit_already_pruned() -> None:
    # visit 2's key is gone (pruned before): visit 1's, older still, is not looked at again
    asked: list[int] = []
    times = {4: 0.0, 3: 0.0, 1: 0.0}

    def written(k: int) -> float | None:
        asked.append(k)
        return times.get(k)

    assert prunable_visits(5, written, now_s=10 * H, horizon_s=H) == [4, 3]
    assert asked == [4, 3, 2]


def test_the_walk_is_bounded() -> None:
    times = dict.fromkeys(range(1, 1000), 0.0)
    assert prunable_visits(1000, _at(times), 10 * H, H, max_walk=10) == list(range(999, 989, -1))


def _run(interval_s: float, visits: int, replay_at: float | None = None
         ) -> tuple[dict[int, float], list[tuple[int, bool]]]:
    """Visits 0..visits-1 of one page every ``interval_s`` as the fetch stage prunes on
    each: the seen store after, and for a copy of each visit arriving ``replay_at`` s after
    its key was written (after the visits due by then), whether its key still met it."""
    store: dict[int, float] = {}
    replays: list[tuple[int, bool]] = []
    for n in range(visits):
        now = n * interval_s
        for k in prunable_visits(n, store.get, now, H):
            del store[k]
        store[n] = now
        if replay_at is not None:
            replays += [(k, k in store) for k in range(n)
                        if now - interval_s < k * interval_s + replay_at <= now]
    return store, replays


def test_a_page_revisited_less_often_than_the_horizon_keeps_its_first_and_latest_keys() -> None:
    store, _ = _run(interval_s=H * 1.5, visits=20)
    assert sorted(store) == [0, 19]


def test_a_page_revisited_more_often_keeps_only_the_visits_within_the_horizon() -> None:
    store, _ = _run(interval_s=H / 4, visits=40)
    # visits 35..39 were written within the horizon of the last one (at 39 * H / 4)
    assert sorted(store) == [0, 35, 36, 37, 38, 39]


@pytest.mark.parametrize("interval", [H / 4, H / 2, H * 0.99])
def test_a_replay_within_the_horizon_is_still_suppressed(interval: float) -> None:
    """A copy of visit n-1 arriving any time within the horizon of its key's write, after
    visit n was stored and pruned, still meets that key."""
    for replay_at in (interval, H * 0.99):
        _, replays = _run(interval_s=interval, visits=12, replay_at=replay_at)
        assert replays and all(kept for _, kept in replays), (interval, replay_at, replays)


def test_visit_keys_name_the_chain_of_one_page() -> None:
    job = {"url": "https://e.test/a", "profile": "desk", "pinned": True, "visit": 3,
           "meta": {"replay_id": "r"}}
    assert visit_key(job, 0) == "desk|https://e.test/a"
    assert visit_key(job, 2) == job_dedupe_key({**job, "visit": 2, "meta": {}})


TP = ("crawl.frontier", 0)


def test_a_drop_rides_its_transaction_and_suppresses_until_it_commits() -> None:
    led = Ledger()
    led.assign([TP])
    old = "desk|http://a/ visit:1"
    epoch = led.admit(TP, 0)
    assert epoch is not None
    pj = Pending(TP, 0, epoch, {"url": "http://a/", "target": "a", "profile": "desk",
                                "attempt": 0, "visit": 2}, "desk|http://a/ visit:2")
    led.hold(pj)
    assert led.finish(pj, [Output("crawl.seen", 0, old.encode(), None, [])], (DONE, 0),
                      drops=[old])
    store = {(0, old): (DONE, 0)}  # committed state: the old key is there until the commit
    replay = Pending(TP, 1, epoch, {**pj.job, "visit": 1}, old)
    assert led.is_duplicate(replay, lambda p, k: store.get((p, k)))
    batch = led.take_commit({})
    assert batch is not None and batch.seen == {(0, pj.key): (DONE, 0), (0, old): None}
    assert led.is_duplicate(replay, lambda p, k: store.get((p, k)))  # committing: still there
    assert batch.jobs == 1  # a drop is no job


def test_a_committed_drop_deletes_the_key_and_its_write_time_is_known(tmp_path: Path) -> None:
    store = SeenStore.at(tmp_path)
    try:
        store.open(0)
        store.put_many([(0, "d|http://a/ visit:1", DONE, 0), (0, "d|http://a/", DONE, 0)])
        written = store.written(0, "d|http://a/ visit:1")
        assert written is not None and abs(written - time.time()) < 5
        assert store.written(0, "d|http://a/ visit:9") is None
        store.put_many([(0, "d|http://a/ visit:1", None, 0)])
        assert store.get(0, "d|http://a/ visit:1") is None
        assert store.written(0, "d|http://a/ visit:1") is None
        assert store.get(0, "d|http://a/") == (DONE, 0)
    finally:
        store.close()


def test_churning_changelogs_roll_segments_within_hours() -> None:
    """Timer changelogs (and the expiring seen store's) get segments compaction can clean
    within hours; a tombstone outlives its cleaning by far longer than any restore."""
    topo = Topology(prefix="t.")
    names = {f"t.{t.changelog}" for spec in all_specs() for t in spec.timers}
    names |= {f"t.{s.changelog}" for spec in all_specs() for s in spec.stores
              if s.ttl_setting}
    assert {"t.crawl.revisit.timers", "t.crawl.timers", "t.crawl.seen"} <= names
    restore_s = Settings().restore_timeout_s
    for name in names:
        cfg = topo.spec(name).config
        assert int(cfg["segment.ms"]) <= 3 * 3600 * 1000, name
        assert int(cfg["delete.retention.ms"]) > 100 * restore_s * 1000, name
