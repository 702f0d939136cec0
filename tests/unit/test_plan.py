"""The capacity plan's arithmetic, on hand-made costs whose answers are worked out here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.errors import ConfigError
from crawlfleet.plan import Costs, NodeLimits, plan

COSTS = Costs(cpu_s={"fetch": 0.0004, "parse": 0.0003, "store": 0.0002, "retry": 0.00001,
                     "broker": 0.0001},
              topic_bytes={"frontier": 200.0, "fetched": 12_000.0, "parsed": 4_000.0,
                           "seen": 60.0},
              seen_bytes_per_key=40.0, store_bytes_per_page=3_000.0, page_bytes=12_000.0,
              measured={"pages": 10_000, "commit": "abc", "at": "2026-12-02"},
              parked_bytes_per_record=100.0, timer_bytes_per_record=120.0,
              timers_per_page=0.03)
HELD = {"parked_bytes_per_record": 100.0, "timer_bytes_per_record": 120.0,
        "timers_per_page": 0.03, "parked_per_page": 0.4, "measured": {"pages": 2000}}


def test_one_billion_pages_a_day() -> None:
    p = plan(1e9, 10_000_000, 2.0, COSTS)
    assert round(p.pages_per_s) == 11_574  # 1e9 / 86,400
    # fetch: 11,574 x 0.0004 s = 4.63 CPU-s/s over 0.8 per worker -> 6 workers
    assert p.workers == {"fetch": 6, "parse": 5, "store": 3, "retry": 1, "revisit": 1}
    # written: 11,574 x 16,260 B = 188.2 MB/s, x3 replicas = 564.6 MB/s -> 6 brokers at 100
    assert p.broker_mb_s == pytest.approx(564.58, abs=0.1) and p.brokers == 6
    # fetched: 138.9 MB/s over 5 MB/s per partition -> 28 partitions
    assert p.partitions == 28
    # 7 days of keys (7e9) x 40 B = 280 GB; changelog 7e9 x 60 B x 3 = 1,260 GB
    assert p.seen_gb == pytest.approx(280.0) and p.changelog_gb == pytest.approx(1260.0)
    assert p.store_gb_per_day == pytest.approx(3000.0) and p.store_nodes == 1
    assert p.politeness_pages_per_s == 20_000_000
    # fetch CPU 4.63 / (6 x 0.8) = 96% beats broker disk 564.6 / 600 = 94%
    assert p.saturates_first == "fetch workers' CPU"


def test_held_work_stores_are_sized_from_the_backlog_and_the_retry_wait() -> None:
    p = plan(1e9, 10_000_000, 2.0, COSTS)
    # default backlog: a day's pages parked (1e9 x 100 B = 100 GB), 3 replicas of it
    assert p.parked_gb == pytest.approx(100.0) and p.parked_changelog_gb == pytest.approx(300.0)
    # 11,574 pages/s x 0.03 retries x 3,600 s waiting x 120 B = 0.15 GB
    assert p.timers_gb == pytest.approx(0.15) and p.timers_changelog_gb == pytest.approx(0.45)
    small = plan(1e9, 10_000_000, 2.0, COSTS, NodeLimits(backlog=1e6))
    assert small.parked_gb == pytest.approx(0.1)


def test_every_resource_load_is_reported_and_the_highest_saturates_first() -> None:
    p = plan(1e9, 10_000_000, 2.0, COSTS)
    assert p.loads["fetch workers' CPU"] == pytest.approx(11_574.07 * 0.0004 / 4.8, rel=1e-4)
    assert max(p.loads, key=p.loads.__getitem__) == p.saturates_first
    assert all(0 < v <= 1 for v in p.loads.values())


def test_caps_that_cannot_carry_the_rate_saturate_first_and_say_so() -> None:
    p = plan(1e9, 1_000, 2.0, COSTS)  # 2,000 pages/s allowed, 11,574 asked
    assert p.saturates_first == "the politeness caps (targets x cap)"
    assert any("caps allow only 2,000 pages/s" in n for n in p.notes)


def test_bigger_pages_scale_the_bytes_not_the_frontier() -> None:
    small = plan(1e8, 100_000, 2.0, COSTS)
    big = plan(1e8, 100_000, 2.0, COSTS, NodeLimits(page_bytes=120_000.0))
    assert big.store_gb_per_day == pytest.approx(10 * small.store_gb_per_day)
    assert big.broker_mb_s > 9 * small.broker_mb_s
    # CPU follows the bytes too, in the workers and in the load they are sized against
    # parse: 1,157 pages/s x 0.0003 s x 10 = 3.47 CPU-s/s -> 5 workers at 87%
    assert small.workers["parse"] == 1 and big.workers["parse"] == 5
    assert big.loads["parse workers' CPU"] > 0.5


def test_costs_come_from_a_measured_file(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    with pytest.raises(ConfigError, match=r"bench\.cost_bench"):
        Costs.load(path)
    path.write_text(json.dumps({
        "cpu_s_per_page": COSTS.cpu_s, "topic_bytes_per_page": COSTS.topic_bytes,
        "seen_bytes_per_key": 40.0, "store_bytes_per_page": 3000.0, "page_bytes": 12000.0,
        "measured": COSTS.measured, "held": HELD}))
    assert Costs.load(path) == COSTS


def test_the_plan_command_prints_the_plan_or_says_where_costs_come_from(
        tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from crawlfleet.cli import app
    missing = CliRunner().invoke(app, ["plan", "--pages-per-day", "1e9", "--targets",
                                       "10000000", "--costs", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "bench.cost_bench" in missing.output
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({
        "cpu_s_per_page": COSTS.cpu_s, "topic_bytes_per_page": COSTS.topic_bytes,
        "seen_bytes_per_key": 40.0, "store_bytes_per_page": 3000.0, "page_bytes": 12000.0,
        "measured": COSTS.measured, "held": HELD}))
    out = CliRunner().invoke(app, ["plan", "--pages-per-day", "1e9", "--targets", "10000000",
                                   "--costs", str(path)], env={"COLUMNS": "200"}).output
    assert "11,574" in out and "fetch workers" in out and "saturates first" in out


def test_the_committed_costs_were_measured_and_load() -> None:
    """``crawlfleet plan`` reads infra/costs.json by default: it must be a measured file."""
    costs = Costs.load()
    assert costs.measured["pages"] >= 1_000 and costs.measured["commit"] != "unknown"
    assert all(costs.cpu_s[st] > 0 for st in ("fetch", "parse", "store", "broker"))
    assert costs.parked_bytes_per_record > 0 and costs.timer_bytes_per_record > 0


def test_binds_first_names_the_kind_and_the_others_margins() -> None:
    p = plan(1e9, 10_000_000, 2.0, COSTS)
    # fetch CPU 96% is the highest load: CPU binds first
    assert p.binds_first == "CPU"
    margins = p.margins()
    assert set(margins) == {"CPU", "broker", "store", "disk", "network", "politeness"}
    # broker disk writes 564.6 / 600 = 94%: 1 / 0.941 - 1 = 6% more before it binds
    assert margins["broker"] == (pytest.approx(600 / 564.58 - 1, rel=1e-3),
                                 "broker disk writes")
    assert next(iter(margins)) == "CPU"  # nearest its limit first
    assert all(a[0] <= b[0] for a, b in zip(list(margins.values()),
                                            list(margins.values())[1:], strict=False))


def test_brokers_are_sized_to_their_cpu_and_fetch_workers_to_their_disk() -> None:
    cpu_heavy = dataclasses.replace(COSTS, cpu_s={**COSTS.cpu_s, "broker": 0.002})
    p = plan(1e9, 10_000_000, 2.0, cpu_heavy)
    # 11,574 pages/s x 0.002 s x 3 replicas = 69.4 cores over 4 per broker -> 18 brokers
    assert p.brokers == 18 and p.binds_first == "broker"
    # 100 GB disks: 280 GB dedupe + 100 GB parked = 380 GB -> 4 workers; at 10 GB, 38
    small_disk = plan(1e9, 10_000_000, 2.0, COSTS, NodeLimits(worker_disk_gb=10.0))
    assert small_disk.workers["fetch"] == 38
    assert small_disk.loads["fetch workers' state disk"] == pytest.approx(380 / 380)


def test_the_wire_follows_the_measured_ratio_of_consumed_to_produced() -> None:
    wired = dataclasses.replace(COSTS, wire_in=16_260.0, wire_out=32_520.0)
    p = plan(1e9, 10_000_000, 2.0, wired)
    produced = 11_574.07 * 16_260 / 1e6  # 188.2 MB/s
    assert p.network_mb_s[0] == pytest.approx(3 * produced, rel=1e-4)
    assert p.network_mb_s[1] == pytest.approx(2 * produced + 2 * produced, rel=1e-4)


def test_the_costs_ship_inside_the_package() -> None:
    """``crawlfleet plan`` reads them through importlib.resources: package data, not a
    path beside the checkout."""
    import tomllib
    from importlib.resources.abc import Traversable

    from crawlfleet import plan as plan_mod
    assert isinstance(plan_mod.COSTS, Traversable) and plan_mod.COSTS.name == "costs.json"
    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    assert "costs.json" in data["tool"]["setuptools"]["package-data"]["infra"]
