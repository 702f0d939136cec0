"""Fault scheduling and mixing: least-hit first, spread over the crawl, every stage hit."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from chaos.fault_plan import (
    BROKER_FREEZE,
    BROKER_KILL,
    HEAVY,
    RESTART_ALL,
    STATE_WIPE,
    STORE_RESTART,
    WORKER_KILL,
    StageCycle,
    least_hit,
    plan_round,
    progress_points,
    usable_kinds,
)


def test_least_hit_kinds_come_first() -> None:
    counts = {BROKER_KILL: 3, BROKER_FREEZE: 1, RESTART_ALL: 1, STORE_RESTART: 2,
              STATE_WIPE: 5}
    for seed in range(20):  # whatever the tie-break, the two kinds hit once come first
        got = least_hit(counts, HEAVY, 2, random.Random(seed))
        assert sorted(got) == sorted([BROKER_FREEZE, RESTART_ALL])
    assert least_hit(counts, HEAVY, 3, random.Random(0))[2] == STORE_RESTART
    assert least_hit({}, HEAVY, 9, random.Random(0)).__len__() == len(HEAVY)  # no repeats


def test_ties_are_broken_by_the_seed_not_by_name() -> None:
    firsts = {least_hit({}, HEAVY, 1, random.Random(seed))[0] for seed in range(40)}
    assert len(firsts) >= 3


def test_progress_points_spread_over_the_crawl() -> None:
    assert progress_points(0) == []
    assert progress_points(1) == [0.15]
    assert progress_points(2) == [0.15, 0.6]
    assert progress_points(4, 0.1, 0.7) == [0.1, 0.3, 0.5, 0.7]


def test_a_round_is_reproducible_from_its_seed_and_index() -> None:
    a = plan_round(3, 7, {}, heavy_per_round=2)
    b = plan_round(3, 7, {}, heavy_per_round=2)
    assert a == b
    assert a.kinds[0] == WORKER_KILL and len(a.heavy) == 2
    assert len({f.kind for f in a.heavy}) == 2  # two different faults in one round
    assert [f.at_progress for f in a.heavy] == [0.15, 0.6]


def test_rounds_fed_their_own_counts_hit_every_kind_evenly() -> None:
    counts: Counter[str] = Counter()
    for i in range(10):  # 10 rounds x 2 = 20 heavy faults over 5 kinds
        plan = plan_round(i, 1, counts, heavy_per_round=2)
        counts.update(f.kind for f in plan.heavy)
    assert counts == dict.fromkeys(HEAVY, 4)


def test_a_resumed_soak_fills_in_what_earlier_runs_hit_least() -> None:
    earlier = {BROKER_KILL: 6, BROKER_FREEZE: 6, RESTART_ALL: 6, STORE_RESTART: 2,
               STATE_WIPE: 6}
    plan = plan_round(0, 1, earlier, heavy_per_round=1)
    assert [f.kind for f in plan.heavy] == [STORE_RESTART]


def test_one_node_cannot_lose_or_freeze_its_only_broker() -> None:
    assert usable_kinds(1) == (RESTART_ALL, STORE_RESTART, STATE_WIPE)
    assert usable_kinds(3) == HEAVY


def test_worker_kills_hit_every_stage_before_any_twice() -> None:
    workers = ["fetch-0", "fetch-1", "parse-0", "parse-1", "store-0", "retry-0"]
    cycle = StageCycle(random.Random(5))
    for _ in range(3):
        stages = [cycle.next_victim(workers).rsplit("-", 1)[0] for _ in range(4)]
        assert sorted(stages) == ["fetch", "parse", "retry", "store"]


def test_state_wipes_pick_only_stages_with_local_state() -> None:
    workers = ["fetch-0", "fetch-1", "parse-0", "store-0", "retry-0"]
    cycle = StageCycle(random.Random(2))
    picked = [cycle.next_victim(workers, ("fetch", "retry")) for _ in range(6)]
    assert {p.rsplit("-", 1)[0] for p in picked} == {"fetch", "retry"}
    assert Counter(p.rsplit("-", 1)[0] for p in picked) == {"fetch": 3, "retry": 3}
    with pytest.raises(ValueError, match="no worker"):
        cycle.next_victim(["parse-0"], ("fetch", "retry"))
