"""Imports run one way, as pyproject's import-linter contract writes the layers down."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_layer_contract_is_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout


def test_the_contract_covers_every_package_top_to_bottom() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = conf["contracts"]
    layers = [m.strip() for layer in contract["layers"]
              for m in layer.replace("|", ":").split(":")]
    packages = set(conf["root_packages"])
    assert {m.split(".")[0] for m in layers} == packages  # no package left unconstrained
    assert layers[0] == "crawlfleet.cli" and layers[-1] == "core.errors"
    assert layers.index("consumers") < layers.index("producers") < layers.index("streams") \
        < layers.index("infra") < layers.index("schemas")


def test_the_stream_runtime_lives_in_streams() -> None:
    """The runtime's modules are in ``streams/``, none left in the stages' package."""
    runtime = {"io", "committer", "batch_stage", "membership", "offsets", "ledger",
               "state_store", "restorer", "slow_start", "control", "backpressure", "worker",
               "status", "metrics", "faults"}
    assert runtime <= {p.stem for p in (ROOT / "streams").glob("*.py")}
    left = runtime & {p.stem for d in ("consumers", "producers", "infra")
                      for p in (ROOT / d).glob("*.py")}
    assert left == {"control"}, left  # producers/control.py: what people publish to it


def test_test_modules_have_unique_names() -> None:
    """pytest imports test files by basename (no packages): a unit and an integration test
    of the same name stop the whole suite at collection."""
    tests = Path(__file__).resolve().parents[1]
    unit = {p.name for p in (tests / "unit").glob("test_*.py")}
    integration = {p.name for p in (tests / "integration").glob("test_*.py")}
    assert not unit & integration


def test_the_fetch_session_is_wiring_only() -> None:
    """Issue 18: fetch's ``_Session`` keeps the Kafka wiring (300 lines at most); intake,
    dispatch, the state stores and the per-target policy are objects of their own."""
    lines = (ROOT / "consumers" / "fetch" / "stage.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class _Session"))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i][0].isspace() and not lines[i].startswith("#")),
               len(lines))
    assert end - start <= 300, end - start


def test_no_module_outside_the_sites_is_over_600_lines() -> None:
    """Issue 18: a module that grows past 600 lines mixes concerns; the local sites of the
    demo and the tests (``sites/``) are the exception: each is one site."""
    big = {}
    for package in ("crawlfleet", "chaos", "core", "schemas", "producers", "consumers",
                    "streams", "infra"):
        for path in (ROOT / package).rglob("*.py"):
            n = len(path.read_text().splitlines())
            if n > 600:
                big[str(path.relative_to(ROOT))] = n
    assert not big, big
