"""A query with no store where the command stands names the absolute path and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.config import load_settings
from core.errors import ConfigError
from infra.store_query import run_query


def test_no_store_here_names_the_absolute_path_and_how_to_point_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        run_query(load_settings(), "SELECT 1")
    text = str(err.value)
    assert str(tmp_path.resolve() / ".crawlfleet" / "clickhouse") in text
    assert "--data-dir" in text and "CRAWLFLEET_DATA_DIR" in text
    assert "relative to where you run" in text
