"""The queue sampler's baseline (where every group stands when the store starts, so the first
sample has a rate) is read from committed offsets alone: asking the partition leaders for end
offsets on topics a crawl made a moment ago took ~3 s in some starts, and a store told to stop
meanwhile waited for it before it could exit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from consumers.sampler import QueueSampler
from core.config import Settings
from infra.topics import topology_of
from schemas.stages import stages


class _Probe:
    """Committed offsets answer; end offsets must not be asked."""

    def __init__(self, committed: dict[str, dict[tuple[str, int], int]]) -> None:
        self.by_group = committed
        self.asked_ends = 0

    def committed(self, group: str, topics: list[str],
                  partitions: int) -> dict[tuple[str, int], int] | None:
        return self.by_group.get(group)

    def positions(self, *args: Any) -> None:
        self.asked_ends += 1
        raise AssertionError("the baseline asked the partition leaders for end offsets")


def test_the_baseline_reads_committed_offsets_only(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, bootstrap_servers="127.0.0.1:1")
    topo = topology_of(s)
    sampler = QueueSampler(s, store=None, worker="store-0")  # type: ignore[arg-type]
    fetch_in = topo.inputs("fetch")
    probe = _Probe({topo.group("fetch"): {(fetch_in[0], 0): 40, (fetch_in[0], 1): -1,
                                          (fetch_in[0], 2): 2}})
    sampler._probe = probe  # type: ignore[assignment]
    base = sampler.baseline(100.0)
    assert probe.asked_ends == 0
    assert base[("fetch", fetch_in[0])] == (100.0, 42)  # a partition never committed: 0
    # Groups the coordinator does not answer for are left out (their first rate reads 0).
    assert {stage for stage, _ in base} == {"fetch"} and "fetch" in stages()
