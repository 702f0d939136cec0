"""The embedded store starts its engine with crawlfleet's options, not the engine's defaults:
an idle store worker should not wake ten times a second to re-read allocator statistics."""

from __future__ import annotations

from core.config import Settings
from infra.clickhouse import Store

_SQL = "SELECT value, changed FROM system.server_settings WHERE name = 'memory_worker_period_ms'"


def test_the_embedded_engine_runs_its_memory_worker_once_a_second(
        embedded_settings: Settings) -> None:
    store = Store(embedded_settings)
    try:
        assert store.query(_SQL)[1] == [("1000", 1)]
    finally:
        store.close()
