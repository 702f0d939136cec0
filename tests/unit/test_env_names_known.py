"""Every ``CRAWLFLEET_*`` variable the code reads is one a worker accepts.

A worker refuses unknown ``CRAWLFLEET_*`` variables (a misspelt setting must not pass
silently); a variable read by a tool beside it, such as the rolling restart's results path,
was refused too, so every worker of a fleet started with it set crash-looped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from core.config import load_settings
from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"[\"'](CRAWLFLEET_[A-Z0-9_]+)[\"']")


def _read_names() -> set[str]:
    """Names in the code (test modules aside: they spell names wrong on purpose)."""
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or path.name.startswith("test_"):
            continue
        found.update(_NAME.findall(path.read_text(errors="replace")))
    return found


def test_the_scan_finds_the_tools_variables() -> None:
    assert {"CRAWLFLEET_ROLL_RESULTS", "CRAWLFLEET_FAULT", "CRAWLFLEET_HOME"} <= _read_names()


@pytest.mark.parametrize("name", sorted(_read_names()))
def test_a_worker_accepts_every_variable_the_code_reads(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(name, "1")
    try:
        load_settings(data_dir=tmp_path / "data")
    except ConfigError as exc:
        assert "unknown environment variable" not in str(exc), str(exc)
