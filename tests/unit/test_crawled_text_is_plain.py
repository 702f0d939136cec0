"""Crawled text never runs as markup: a ``[/]`` or a ``[link=...]`` in a page's error text
(or title) is printed as written by ``sql``, ``dlq show`` and ``trace``, and crashes none.
(URLs are canonical, brackets percent-encoded: they cannot carry markup.)"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.config import load_settings
from core.urls import canonicalize
from crawlfleet.cli import app
from infra.clickhouse import DEAD_COLUMNS, Store

#: Canonical already (as a stored URL is): brackets in a query string are kept as written.
HOSTILE_URL = canonicalize("http://127.0.0.2:18099/a?q=[/]&r=[link=http://evil.test]x[/link]")
HOSTILE_ERROR = "HTTP 503 [bold red]fake[/] [/] [link=http://evil.test]click[/link]"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    s = load_settings(data_dir=tmp_path / "data")
    store = Store(s)
    store.ensure_schema()
    job = {"url": HOSTILE_URL, "profile": "default", "target": "127.0.0.2", "depth": 0,
           "attempt": 3, "priority": 0, "parent_url": None, "last_error": "http_503",
           "delay_ms": 0, "meta": {}}
    store.insert("dead_letters", DEAD_COLUMNS, [(
        "p.crawl.dead:0:7", datetime.now(UTC), HOSTILE_URL, "127.0.0.2", "default",
        "p.crawl.frontier", "http_503", HOSTILE_ERROR, 3, "fetch-0", "0.1.0", "00",
        json.dumps(job))], "t1")
    store.close()
    return {"CRAWLFLEET_DATA_DIR": str(s.data_dir), "COLUMNS": "400"}


@pytest.mark.parametrize("args", [
    ["sql", "SELECT url, error FROM dead_letters_v"],
    ["dlq", "show", "p.crawl.dead:0:7", "--crawl", "p"],
    ["trace", HOSTILE_URL],
])
def test_hostile_text_prints_as_written(env: dict[str, str], args: list[str]) -> None:
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    out = result.output
    assert "[bold red]fake[/] [/] [link=http://evil.test]click[/link]" in out, out
    assert "\x1b]8;" not in out  # no terminal hyperlink planted


def test_an_error_naming_hostile_text_prints_it_as_written(env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["dlq", "show", "[/][link=http://evil.test]x"], env=env)
    assert result.exit_code == 2
    assert "[/][link=http://evil.test]x" in result.output
