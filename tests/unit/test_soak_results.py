"""The soak's results file: rounds on one commit add up, per commit, across runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.fault_plan import FAULT_KINDS
from chaos.soak import (
    TARGET_MINUTES,
    append_result,
    fault_counts,
    read_results,
    summarise,
)


def _round(commit: str, seconds: float, faults: dict[str, int], *, lost: int = 0,
           duplicates: int = 0, ok: bool = True, within: bool = True,
           gauge: bool = True) -> dict[str, Any]:
    return {"commit": commit, "at": "2026-11-20T10:00:00+00:00", "seconds": seconds,
            "faults": faults, "lost": lost, "duplicates": duplicates, "ok": ok,
            "within_bound": within, "uncommitted_gauge": gauge}


def test_rounds_of_one_commit_add_up_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "soak.jsonl"
    append_result(path, _round("aaa", 120.0, {"worker_kill": 9, "broker_kill": 1}))
    append_result(path, _round("bbb", 60.0, {"worker_kill": 4}))
    # a later run (another session) appends to the same file
    append_result(path, _round("aaa", 180.0, {"worker_kill": 11, "state_wipe": 2}, lost=3,
                               ok=False))
    path.write_text(path.read_text() + '{"torn line\n')  # a run killed mid-write
    rounds = read_results(path)
    assert len(rounds) == 3
    by = {t.commit: t for t in summarise(rounds)}
    a = by["aaa"]
    assert a.rounds == 2 and a.ok_rounds == 1
    assert a.minutes == 5.0
    assert a.faults == {"worker_kill": 20, "broker_kill": 1, "state_wipe": 2}
    assert a.lost == 3 and a.duplicates == 0
    assert by["bbb"].minutes == 1.0
    assert fault_counts(rounds, "aaa") == {"worker_kill": 20, "broker_kill": 1,
                                           "state_wipe": 2}
    assert fault_counts(rounds, "zzz") == {}


def test_a_missing_file_has_no_rounds(tmp_path: Path) -> None:
    assert read_results(tmp_path / "none.jsonl") == []


def test_the_target_needs_minutes_every_kind_and_clean_rounds() -> None:
    per_round = dict.fromkeys(FAULT_KINDS, 1)
    enough = [_round("c", TARGET_MINUTES * 60 / 5, per_round) for _ in range(5)]
    assert summarise(enough)[0].meets_target
    short = enough[:4]  # 96 minutes and four of each kind
    assert not summarise(short)[0].meets_target
    one_kind_short = [*enough[:4], _round("c", TARGET_MINUTES * 60 / 5,
                                          {**per_round, "broker_freeze": 0})]
    assert not summarise(one_kind_short)[0].meets_target
    over_bound = [*enough[:4], _round("c", TARGET_MINUTES * 60 / 5, per_round, within=False)]
    t = summarise(over_bound)[0]
    assert t.over_bound == 1 and not t.meets_target
    legacy = summarise([*enough[:4], _round("c", TARGET_MINUTES * 60 / 5, per_round,
                                            gauge=False)])[0]
    assert legacy.legacy_bound == 1
