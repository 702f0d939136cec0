"""Imports run one way, as pyproject's import-linter contract writes the layers down."""

from __future__ import annotations

import ast
import re
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


def test_no_module_is_over_600_lines() -> None:
    """Issue 18: a module that grows past 600 lines mixes concerns; the rule holds for the
    local sites (``sites/``) and the benchmarks (``bench/``) too."""
    big = {}
    for package in ("crawlfleet", "chaos", "core", "schemas", "producers", "consumers",
                    "streams", "infra", "sites", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            n = len(path.read_text().splitlines())
            if n > 600:
                big[str(path.relative_to(ROOT))] = n
    assert not big, big


PRODUCT = ("crawlfleet", "chaos", "core", "schemas", "producers", "consumers", "streams",
           "infra")


def _product_sources() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), path.read_text())
            for package in PRODUCT for path in (ROOT / package).rglob("*.py")]


def test_state_stores_are_made_by_the_runtime_alone() -> None:
    """Issue 46: a stage names its stores; only ``streams/`` constructs a ``StateStore``."""
    makers = [name for name, text in _product_sources()
              if "StateStore(" in text.replace("class StateStore(", "")
              and not name.startswith("streams/")]
    assert makers == []


def test_no_stage_name_tuple_outside_the_topology() -> None:
    """Issue 46: every list of stages is read from the registry; only the pipeline's own
    declarations (``schemas/pipeline.py``) spell the stage names as a collection."""
    names = r'"(?:fetch|parse|store|retry|quarantine)"'
    collection = re.compile(rf"[(\[]\s*{names}\s*,|{{\s*{names}\s*[,:}}]")
    found = [f"{name}: {m.group(0)}" for name, text in _product_sources()
             if name != "schemas/pipeline.py" for m in collection.finditer(text)]
    assert found == []


def _wide_initialisers(sources: list[tuple[str, str]], most: int) -> list[str]:
    """Hand-written ``__init__``s taking more than ``most`` arguments (``self`` aside)."""
    wide = []
    for name, text in sources:
        for cls in ast.walk(ast.parse(text)):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                    a = node.args
                    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1
                    if n > most:
                        wide.append(f"{name}: {cls.name} takes {n}")
    return wide


def test_no_hand_written_initialiser_takes_more_than_8_arguments() -> None:
    """Issue 46: a constructor that takes everything is a part that owns too much; what a
    session's parts share goes as one record (``FetchWiring``, ``SessionRole``), and
    every per-target question goes to one owner (``Targets``). Records (dataclasses)
    have no hand-written ``__init__`` and are not counted."""
    assert _wide_initialisers(_product_sources(), 8) == []


def test_the_initialiser_check_sees_a_wide_one() -> None:
    """The check above counts positional, keyword-only and defaulted arguments."""
    src = ("class Wide:\n    def __init__(self, a, b, c, d, e, f, g, h=1, *, i=2):\n"
           "        pass\nclass Narrow:\n    def __init__(self, a, *, b=1):\n        pass\n")
    assert _wide_initialisers([("x.py", src)], 8) == ["x.py: Wide takes 9"]


def test_dispatch_and_intake_ask_the_targets_owner() -> None:
    """Issue 46: dispatch and intake reach no per-target part (scheduler, policy, robots.txt
    cache, identities, pacer) but through ``Targets``; none of those parts is theirs."""
    fetch = ROOT / "consumers" / "fetch"
    parts = re.compile(r"\bself\.(sched|policy|robots|ids|pacer)\b|"
                       r"import (TargetScheduler|TargetPolicy|RobotsCache|Identities|Pacer)\b")
    found = [f"{n}: {m.group(0)}" for n in ("dispatch.py", "intake.py")
             for m in parts.finditer((fetch / n).read_text())]
    assert found == []
