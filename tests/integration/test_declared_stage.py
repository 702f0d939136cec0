"""Adding a stage touches the topology and the stage's own module: a stage declared in
``tests/`` alone (``archive_stage``: every parsed page copied to ``crawl.archive``) runs on
the real broker beside the pipeline's own, is started, drained and chaos-killed by the same
helpers, and its output is committed exactly once per key."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from chaos.proof import run_chaos
from crawlfleet.crawl import Plan
from schemas.stages import register_stage, stages, unregister_stage
from tests.integration.test_chaos import _assert_exactly_once, _console

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def archive() -> Iterator[ModuleType]:
    """The stage, declared for this test only: imported here (importing declares it, as in
    a worker process), not at collection, so no other test's pipeline has it."""
    module = importlib.import_module("tests.integration.archive_stage")
    register_stage(module.SPEC, module.TOPICS)  # again after an earlier test forgot it
    try:
        yield module
    finally:
        unregister_stage("archive", (module.ARCHIVE,))


def test_a_declared_stage_is_part_of_the_pipeline(archive: ModuleType) -> None:
    assert stages()[-1] == "archive"
    assert Plan().counts()["archive"] == 1  # the fleet starts one worker for it


def test_a_declared_stage_runs_drains_and_survives_kills_exactly_once(
        archive: ModuleType, tmp_path: Path) -> None:
    report = run_chaos(pages=600, nodes=1, fetch_workers=2, parse_workers=2, kill_every_s=3.0,
                       seed=23, data_dir=tmp_path, timeout_s=300, console=_console(),
                       rate_cap=5.0, baseline=False)
    _assert_exactly_once(report)  # drained: the archive group's lag is 0 too
    assert any(k.worker == "archive-0" for k in report.kills), [k.worker for k in report.kills]
    records, repeats = report.declared_outputs[archive.ARCHIVE]
    assert repeats == 0
    # One record per parsed page: the archive read all of crawl.parsed and nothing twice.
    assert records == report.parsed_records > 0


def test_the_declaration_is_gone_after_the_test() -> None:
    assert "archive" not in stages()


@pytest.fixture
def recheck() -> Iterator[ModuleType]:
    """The stage with a store, a timer and an output (``recheck_stage``), for this test."""
    module = importlib.import_module("tests.integration.recheck_stage")
    register_stage(module.SPEC, module.TOPICS)
    try:
        yield module
    finally:
        unregister_stage("recheck", (module.RECHECKED,))


def test_a_stage_with_a_store_and_a_timer_is_drawn_from_its_own_module(
        recheck: ModuleType) -> None:
    """``crawlfleet top --graph`` in a process that knows the stage only from stage_modules."""
    env = {**os.environ, "CRAWLFLEET_STAGE_MODULES": "tests.integration.recheck_stage"}
    out = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "top", "--graph"],
                         env=env, capture_output=True, text=True, timeout=60, check=True,
                         cwd=REPO).stdout
    lines = out.splitlines()
    assert any(re.search(r"parse ─▶ crawl\.parsed +─▶ store, recheck$", ln) for ln in lines)
    assert any(re.search(r"recheck ─▶ crawl\.rechecked +─▶ ·$", ln) for ln in lines)
    assert any("crawl.recheck.timers" in ln and "[recheck.due store: holds work]" in ln
               for ln in lines), out
    assert any("crawl.recheck.pages" in ln and "[recheck.pages store: state]" in ln
               for ln in lines), out


def test_a_stage_with_a_store_and_a_timer_is_restored_after_kills_and_fires_once(
        recheck: ModuleType, tmp_path: Path) -> None:
    """Started by the fleet, killed by chaos, its store and timers restored by the runtime
    (a page whose store entry a restore missed would never be written), its timers waited
    for by the drain check, each fired once: one committed output per parsed page."""
    report = run_chaos(pages=600, nodes=1, fetch_workers=2, parse_workers=2, kill_every_s=3.0,
                       seed=29, data_dir=tmp_path, timeout_s=300, console=_console(),
                       rate_cap=5.0, baseline=False)
    _assert_exactly_once(report)  # drained, by the broker too: no live recheck timer left
    assert report.broker.live.get(recheck.TIMERS) == 0, report.broker.live
    assert any(k.worker == "recheck-0" for k in report.kills), [k.worker for k in report.kills]
    records, repeats = report.declared_outputs[recheck.RECHECKED]
    assert repeats == 0
    assert records == report.parsed_records > 0
