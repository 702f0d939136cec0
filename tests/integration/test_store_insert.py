"""The store's insert path on the real chDB engine: dedupe tokens with reused contexts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.config import load_settings
from infra.clickhouse import EVENT_COLUMNS, Store

pytestmark = pytest.mark.integration


def _event(n: int) -> tuple[object, ...]:
    return (f"t:0:{n}", datetime(2026, 11, 29, tzinfo=UTC), f"http://h/{n}", "h", "default", 0,
            200, "ok", "", 3, 100, "fetch-0", "f1", "aiohttp", "tls", "1", "rev", "direct")


def test_reused_insert_context_keeps_each_batchs_dedupe_token(tmp_path: Path) -> None:
    store = Store(load_settings(data_dir=tmp_path))
    store.ensure_schema()
    try:
        store.insert("fetch_events", EVENT_COLUMNS, [_event(1), _event(2)], "tok-a")
        store.insert("fetch_events", EVENT_COLUMNS, [_event(3)], "tok-a")  # a replay: dropped
        store.insert("fetch_events", EVENT_COLUMNS, [_event(4)], "tok-b")
        with pytest.raises(Exception):  # noqa: B017 - the driver raises its own types
            store.insert("fetch_events", EVENT_COLUMNS, [("too", "short")], "tok-c")
        store.insert("fetch_events", EVENT_COLUMNS, [_event(5)], "tok-d")  # still works
        ids = store.query("SELECT event_id FROM fetch_events ORDER BY event_id")[1]
        assert [r[0] for r in ids] == ["t:0:1", "t:0:2", "t:0:4", "t:0:5"]
    finally:
        store.close()


def test_warm_up_leaves_no_table_and_survives_a_leftover(tmp_path: Path) -> None:
    store = Store(load_settings(data_dir=tmp_path))
    store.ensure_schema()
    try:
        # A store killed mid-warm-up leaves its scratch table behind: the next one copes.
        store.command("CREATE TABLE _crawlfleet_warm_up (n UInt8) ENGINE = MergeTree "
                      "ORDER BY tuple()")
        store.warm_up()
        store.warm_up()
        tables = {r[0] for r in store.query("SHOW TABLES")[1]}
        assert "_crawlfleet_warm_up" not in tables
        assert {"pages", "fetch_events", "dead_letters"} <= tables
        store.insert("fetch_events", EVENT_COLUMNS, [_event(1)], "tok-a")
        assert store.query("SELECT count() FROM fetch_events")[1] == [(1,)]
    finally:
        store.close()
