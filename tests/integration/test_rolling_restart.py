"""A rolling restart on the real brokers: on three KRaft nodes, during a crawl, every broker
is stopped cleanly and started again, one after another, then every worker of every stage:
every page is stored exactly once and no host sees more than its cap. The pace during each
step is printed (the fault's detail), never judged.

Sized so the whole roll runs under load, on the default cap (2 requests/s per host): 3,000
pages on 8 hosts take at least 188 s at the cap, while the roll starts at 3% (~6-9 s) and
ends at ~183-187 s (each broker step ~43 s under load, each worker step ~6 s); measured, the
roll ended at 90% requested and every step's pace was > 0. A crawl over before the roll's
last step fails the paces' check below. The 3,600 pages this test once crawled added ~80 s,
all of it after the roll's end (the drain: 105 s then, 25 s now), which proved nothing more.

Every run, passed or failed, appends its figures to ``bench/rolling_restart_results.jsonl``
(:mod:`chaos.roll_results`; README's table is made from it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.fault_plan import ROLLING_RESTART, PlannedFault
from chaos.proof import run_chaos
from chaos.report import ChaosReport, FaultRecord
from chaos.roll_results import record, roll_line
from core.config import Settings
from tests.integration.fleet_helpers import report
from tests.integration.test_chaos import _assert_exactly_once, _console

pytestmark = pytest.mark.integration


def test_a_rolling_restart_of_brokers_then_workers_loses_and_repeats_nothing(
        tmp_path: Path) -> None:
    cap = Settings().rate_cap
    chaos = run_chaos(pages=3000, nodes=3, fetch_workers=2, parse_workers=2,
                       kill_every_s=6.0, seed=17, data_dir=tmp_path, timeout_s=720,
                       console=_console(), rate_cap=cap, baseline=False,
                       heavy=(PlannedFault(ROLLING_RESTART, 0.03),), worker_kills=False)
    (roll,) = [f for f in chaos.faults if f.kind == ROLLING_RESTART]
    line = roll_line(chaos, roll, cap)
    try:
        _assert_rolled_politely(chaos, roll, cap)
    except AssertionError as exc:
        line.update(ok=False, failure=str(exc).splitlines()[0][:300] if str(exc) else "")
        raise
    else:
        line["ok"] = True
    finally:
        record(line)


def _assert_rolled_politely(chaos: ChaosReport, roll: FaultRecord, cap: float) -> None:
    _assert_exactly_once(chaos)
    report("rolling_restart", steps=roll.detail, peak_host_requests=chaos.peak_host_requests)
    assert not roll.error and roll.ended_at_s is not None, roll
    steps = roll.detail.split(": ", 1)[1].split(", ")
    assert [s.split()[0] for s in steps[:3]] == ["broker"] * 3
    restarted = {r.worker for r in chaos.kills if r.cause == ROLLING_RESTART}
    assert restarted == {"fetch-0", "fetch-1", "parse-0", "parse-1", "store-0", "retry-0",
                         "revisit-0"}
    # The roll happened under load: pages were requested during every step, the last
    # worker's too (a roll after the crawl's end would print paces that say nothing).
    paces = {s.rsplit(" ", 1)[0]: float(s.rsplit(" ", 1)[1]) for s in steps}
    assert all(pace > 0 for pace in paces.values()), paces
    # Politeness through it all: at most cap + 1 requests to a host in any 1-s window.
    assert chaos.peak_host_requests <= cap + 1, (chaos.peak_host, chaos.peak_host_requests)
