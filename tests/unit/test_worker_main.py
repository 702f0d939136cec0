"""The crawl's lean worker entry refuses bad arguments and unknown stages with exit 2."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from crawlfleet.phases import Phases, process_age_s
from crawlfleet.worker_main import await_fetch_join, main


@pytest.mark.parametrize("argv", [[], ["--worker-id"], ["fetch", "parse"], ["--x"],
                                  ["retry", "--defer-s"], ["retry", "--defer-s", "soon"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_unknown_stage_is_a_clear_error(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: object) -> None:
    monkeypatch.setenv("CRAWLFLEET_DATA_DIR", str(tmp_path))
    assert main(["fetchh", "--worker-id", "x-0"]) == 2
    err = capsys.readouterr().err
    assert "unknown stage 'fetchh'" in err and "fetch" in err


def test_a_deferred_start_waits_for_a_fetch_member_or_its_limit(tmp_path: Path) -> None:
    began = time.monotonic()
    await_fetch_join(tmp_path, 0.3)  # nobody joined: waits out the limit
    assert time.monotonic() - began >= 0.3
    (tmp_path / "fetch-fetch-0.json").write_text(json.dumps({"rebalances": 0}))
    (tmp_path / "parse-parse-0.json").write_text(json.dumps({"rebalances": 2}))
    began = time.monotonic()
    await_fetch_join(tmp_path, 0.3)  # a fetch worker not joined yet, a parse one joined
    assert time.monotonic() - began >= 0.3
    (tmp_path / "fetch-fetch-0.json").write_text(json.dumps({"rebalances": 1}))
    began = time.monotonic()
    await_fetch_join(tmp_path, 30.0)
    assert time.monotonic() - began < 5.0


def test_phases_count_from_the_process_start() -> None:
    age = process_age_s()
    assert age > 0.0  # this test process started before this line
    phases = Phases()
    phases.mark("now")
    assert phases.marks["now"] >= round(age, 3) - 0.05
