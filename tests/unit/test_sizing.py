"""SCALING.md, sizes.json and the manifests are what ``crawlfleet.sizing`` writes from
infra/costs.json (issue 42 point 4): a cost measured again, or a figure edited by hand,
fails here until ``python -m crawlfleet.sizing --write`` runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from crawlfleet import sizing
from crawlfleet.plan import Costs
from infra import deploy_files


def test_the_committed_files_are_what_the_costs_write() -> None:
    assert sizing.stale() == []
    assert sizing.main(["--check"]) == 0


def test_a_figure_edited_by_hand_is_drift(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    scaling, sizes, committed = tmp_path / "SCALING.md", tmp_path / "sizes.json", \
        deploy_files.SIZES
    shutil.copy(sizing.SCALING, scaling)
    shutil.copy(committed, sizes)
    deploy_files.sizes_table.cache_clear()
    monkeypatch.setattr(sizing, "SCALING", scaling)
    monkeypatch.setattr(deploy_files, "SIZES", sizes)
    assert sizing.stale() == []
    text = sizes.read_text()
    disk = json.loads(text)["stages"]["fetch"]["disk"]  # its share of dedupe + parked state
    assert disk != "10Gi"
    sizes.write_text(text.replace(f'"disk": "{disk}"', '"disk": "10Gi"', 1))
    assert sizing.stale() == [sizes]
    shutil.copy(committed, sizes)
    body = scaling.read_text()
    scaling.write_text(body.replace("| brokers | ", "| brokers | 4 / ", 1))
    assert sizing.stale() == [scaling]
    deploy_files.sizes_table.cache_clear()


def test_a_cost_measured_again_moves_sizes_and_document() -> None:
    costs = Costs.load(sizing.costs_path())
    data = json.loads(sizing.costs_path().read_text())
    dearer = dataclasses.replace(costs, cpu_s={**costs.cpu_s,
                                               "fetch": 2 * costs.cpu_s["fetch"]})
    before, after = sizing.sizes(costs), sizing.sizes(dearer)
    assert after["stages"]["fetch"]["replicas"] > before["stages"]["fetch"]["replicas"]
    current = sizing.SCALING.read_text()
    assert sizing.scaling_text(dearer, data, current) != current
    assert sizing.scaling_text(costs, data, current) == current


def test_sizes_follow_the_plan_at_the_stated_scale() -> None:
    costs = Costs.load(sizing.costs_path())
    p, _ = sizing._plan(costs)
    table = sizing.sizes(costs)
    assert table["partitions"] == p.partitions
    for st, n in p.workers.items():
        assert table["stages"][st]["replicas"] == n
    fetch_gb = (p.seen_gb + p.parked_gb) / p.workers["fetch"]
    disk_gib = float(table["stages"]["fetch"]["disk"].removesuffix("Gi"))
    assert disk_gib * 2**30 / 1e9 >= fetch_gb * sizing.DISK_SLACK
    assert costs.measured["commit"] in table["scale"]


def test_the_readme_walk_through_names_the_fetch_pvc_sizes_json_holds() -> None:
    """README told operators 50Gi while sizes.json said 36Gi: its figure is read from there."""
    readme = (Path(sizing.SCALING).parents[1] / "README.md").read_text()
    disk = json.loads(deploy_files.SIZES.read_text())["stages"]["fetch"]["disk"]
    assert f"(fetch: {disk} each" in readme
