"""Adding a stage touches the topology and the stage's own module: a stage declared in
``tests/`` alone (``archive_stage``: every parsed page copied to ``crawl.archive``) runs on
the real broker beside the pipeline's own, is started, drained and chaos-killed by the same
helpers, and its output is committed exactly once per key."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from chaos.proof import run_chaos
from crawlfleet.crawl import Plan
from schemas.topics import register_stage, stages, unregister_stage
from tests.integration.test_chaos import _assert_exactly_once, _console

pytestmark = pytest.mark.integration


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
