"""The revisit soak benchmark's own arithmetic (bench/revisit_soak.py): the per-cycle growth
it reports, and what it reads off the machine. Pure: no fleet."""

from __future__ import annotations

import os
from pathlib import Path

from bench.revisit_soak import GROWTH, Cycle, disk_bytes, growth, memory_kb


def _cycle(n: int, seen: int, rss: int) -> Cycle:
    state = {key: 0 for _, names in GROWTH for _, key in names}
    state["seen_keys"] = seen
    return Cycle(n, float(n), 10, 10, 10, 0.1, 0.2, 0, {"fetch-0": (rss, rss // 2)}, state)


def test_growth_is_the_slope_per_cycle_after_the_warm_up() -> None:
    # seen keys grow by 48 a cycle; memory jumps in the warm-up, then is flat
    cycles = [_cycle(n, 48 * (n + 1), 1000 if n < 2 else 5000) for n in range(8)]
    lines = growth(cycles)
    assert "fetch-0 +0/+0" in lines[1]
    seen = next(ln for ln in lines if ln.strip().startswith("seen store"))
    assert "live keys +48.0" in seen
    timers = next(ln for ln in lines if ln.strip().startswith("revisit timers"))
    assert "live keys +0.0" in timers
    assert growth(cycles[:3]) == []  # one cycle past the warm-up: no slope yet


def test_memory_and_disk_are_read_from_the_machine(tmp_path: Path) -> None:
    rss, pss = memory_kb(os.getpid())
    assert rss > 0 and 0 < pss <= rss
    assert memory_kb(2 ** 22 + 1) == (0, 0)  # no such process
    (tmp_path / "p0").mkdir()
    (tmp_path / "p0" / "00.log").write_bytes(b"x" * 300)
    (tmp_path / "p0" / "00.index").write_bytes(b"x" * 1000)
    assert disk_bytes(tmp_path) == 1300 and disk_bytes(tmp_path, ".log") == 300
    assert disk_bytes(tmp_path / "none") == 0
