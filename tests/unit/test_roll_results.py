"""The rolling-restart results file's pure parts: a roll's step paces read back from its
detail, and README's table made from recorded lines (a failed run shows as one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.roll_results import ENV, markdown_table, results_path, step_paces

DETAIL = ("requests/s to the site per step: broker 1 9.8, broker 2 11.0, broker 3 8.5, "
          "fetch-0 12.5, store-0 4.0")


def _line(ok: bool, peak: int) -> dict[str, object]:
    return {"at": "2026-12-07T12:30:05+00:00", "commit": "0123456789abcdef",
            "stored_once": 2990, "reachable": 2990, "duplicates": 0, "lost": 0,
            "peak_host_requests": peak, "cap_allowed": 3, "paces": step_paces(DETAIL),
            "seconds": 236.4, "load_1m": 4.52, "ok": ok}


def test_a_rolls_detail_reads_back_as_each_steps_pace() -> None:
    assert step_paces(DETAIL) == {"broker 1": 9.8, "broker 2": 11.0, "broker 3": 8.5,
                                  "fetch-0": 12.5, "store-0": 4.0}
    assert step_paces("") == {}


def test_the_table_has_a_row_per_run_and_shows_a_failed_one() -> None:
    table = markdown_table([_line(True, 3), _line(False, 4)]).splitlines()
    assert len(table) == 4
    assert table[2] == "| 1 | 2026-12-07 12:30 | `0123456` | 2990/2990 | 0 | 0 | 3 (3) | " \
           "9.8 / 11.0 / 8.5 | 4.0-12.5 | 236 | 4.5 | yes |"
    assert table[3].endswith("| NO |") and "| 4 (3) |" in table[3]


def test_the_results_file_is_the_committed_one_unless_the_environment_names_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    default = results_path()
    assert default is not None and default.name == "rolling_restart_results.jsonl"
    monkeypatch.setenv(ENV, str(tmp_path / "r.jsonl"))
    assert results_path() == tmp_path / "r.jsonl"
    monkeypatch.setenv(ENV, "")
    assert results_path() is None
