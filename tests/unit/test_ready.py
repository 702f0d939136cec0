"""``crawl``'s readiness, read from the workers' status files (no group describe)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from core.config import Settings
from crawlfleet.crawl import Plan, _settled
from infra.topics import topology_of


class _Proc:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return None


class _Fleet:
    def __init__(self, plan: Plan, pids: dict[str, int]) -> None:
        self.plan = plan
        self.procs = {wid: _Proc(pid) for wid, pid in pids.items()}


def _write(status_dir: Path, stage: str, wid: str, pid: int, held: list[tuple[str, int]],
           rebalances: int = 1) -> None:
    status_dir.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"stage": stage, "worker": wid, "pid": pid, "counters": {},
                            "gauges": {}, "assignment": [list(tp) for tp in held],
                            "rebalances": rebalances}
    (status_dir / f"{stage}-{wid}.json").write_text(json.dumps(body))


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", partitions=4)


def _whole(settings: Settings, stage: str, parts: range) -> list[tuple[str, int]]:
    topo = topology_of(settings)
    return [(t, p) for t in topo.subscription(stage) + topo.followers(stage) for p in parts]


def _fleet_of_one_each(settings: Settings, fetch: list[list[tuple[str, int]]]) -> _Fleet:
    pids: dict[str, int] = {}
    me = os.getpid()
    for i, held in enumerate(fetch):
        _write(settings.status_dir, "fetch", f"fetch-{i}", me, held)
        pids[f"fetch-{i}"] = me
    for stage in ("parse", "store", "retry", "revisit"):
        _write(settings.status_dir, stage, f"{stage}-0", me, _whole(settings, stage, range(4)))
        pids[f"{stage}-0"] = me
    return _Fleet(Plan(fetch_workers=len(fetch)), pids)


def test_ready_when_the_members_split_every_partition_between_them(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    fleet = _fleet_of_one_each(s, [_whole(s, "fetch", range(0, 2)),
                                   _whole(s, "fetch", range(2, 4))])
    assert _settled(s, fleet, topology_of(s)) is not None  # type: ignore[arg-type]


def test_not_ready_while_a_partition_is_unowned_or_held_twice(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    moving = _fleet_of_one_each(s, [_whole(s, "fetch", range(0, 2)),
                                    _whole(s, "fetch", range(2, 3))])
    assert _settled(s, moving, topology_of(s)) is None  # type: ignore[arg-type]
    twice = _fleet_of_one_each(s, [_whole(s, "fetch", range(0, 3)),
                                   _whole(s, "fetch", range(2, 4))])
    assert _settled(s, twice, topology_of(s)) is None  # type: ignore[arg-type]
    # A lead partition without its follower (the high tier) is not a whole partition.
    topo = topology_of(s)
    half = _fleet_of_one_each(s, [[(topo.frontier, p) for p in range(4)]])
    assert _settled(s, half, topology_of(s)) is None  # type: ignore[arg-type]


def test_a_member_that_has_not_joined_or_a_dead_one_keeps_the_fleet_unready(
        tmp_path: Path) -> None:
    s = _settings(tmp_path)
    fleet = _fleet_of_one_each(s, [_whole(s, "fetch", range(0, 4)), []])
    first = _settled(s, fleet, topology_of(s))  # type: ignore[arg-type]
    assert first is not None
    # Another rebalance since (the same holdings): the marks tell it, so the quiet wait restarts.
    _write(s.status_dir, "fetch", "fetch-1", os.getpid(), [], rebalances=2)
    again = _settled(s, fleet, topology_of(s))  # type: ignore[arg-type]
    assert again is not None and again != first
    _write(s.status_dir, "fetch", "fetch-1", os.getpid(), [], rebalances=0)
    assert _settled(s, fleet, topology_of(s)) is None  # type: ignore[arg-type]
    gone = subprocess.Popen(["true"])
    gone.wait()
    _write(s.status_dir, "fetch", "fetch-1", gone.pid, [])  # an earlier run's report
    assert _settled(s, fleet, topology_of(s)) is None  # type: ignore[arg-type]
