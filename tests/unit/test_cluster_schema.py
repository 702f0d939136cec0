"""The cluster schema, from the same source as the embedded one: every statement parses in
chDB's own parser, and each replicated table has exactly the embedded table's columns, types,
defaults, sorting key and TTL (made in chDB with the replication stripped, then compared)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from core.config import load_settings
from core.errors import ConfigError
from infra.clickhouse import Store
from infra.cluster_schema import cluster_statements, embedded_statements, render, tables

CLUSTER = "crawl"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    st = Store(load_settings(data_dir=tmp_path / "data"))
    st.ensure_schema()
    yield st  # type: ignore[misc]
    st.close()


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def test_every_cluster_statement_parses_in_the_engines_parser(store: Store) -> None:
    stmts = cluster_statements(CLUSTER)
    assert len(stmts) > len(embedded_statements())  # each table: a local and a distributed
    for stmt in stmts:
        formatted = store.scalar(f"SELECT formatQuery({_sql_string(stmt)})")
        assert f"ON CLUSTER {CLUSTER}" in formatted, stmt


def test_each_replicated_table_matches_its_embedded_table(store: Store) -> None:
    made = 0
    for stmt in cluster_statements(CLUSTER):
        m = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)_local ON CLUSTER \w+ ", stmt)
        if not m:
            continue
        name = m[1]
        plain = stmt.replace(f" ON CLUSTER {CLUSTER}", "")
        plain = re.sub(r"ENGINE = Replicated(\w+)\('[^']*', '[^']*'(?:, )?", r"ENGINE = \1(",
                       plain)
        store.command(plain)
        made += 1
        cols = ("SELECT name, type, default_kind, default_expression FROM system.columns "
                "WHERE database = currentDatabase() AND table = '{}' ORDER BY position")
        assert store.query(cols.format(f"{name}_local"))[1] == store.query(cols.format(name))[1]
        keys = ("SELECT sorting_key, engine, replaceRegexpAll(create_table_query, "
                "'.*(TTL [^S]*).*|.*', '\\\\1') FROM system.tables "
                "WHERE database = currentDatabase() AND name = '{}'")
        assert store.query(keys.format(f"{name}_local"))[1] == store.query(keys.format(name))[1]
    assert made == len(tables()) >= 5


def test_reads_shard_by_the_whole_sorting_key_so_final_collapses_per_shard() -> None:
    text = render(CLUSTER)
    for t in tables():
        assert f"Distributed({CLUSTER}, currentDatabase(), {t.name}_local, " \
               f"cityHash64({t.order_by}))" in text
    assert "non_replicated_deduplication_window" not in text
    assert "CREATE OR REPLACE VIEW pages_v ON CLUSTER crawl AS SELECT * FROM pages FINAL" in text


def test_a_bad_cluster_name_is_refused() -> None:
    with pytest.raises(ConfigError):
        cluster_statements("crawl; DROP TABLE pages")


def test_a_cluster_needs_a_server_and_a_plain_name() -> None:
    with pytest.raises(ConfigError, match="clickhouse_dsn"):
        load_settings(clickhouse_cluster="crawl")
    with pytest.raises(ConfigError, match="clickhouse_cluster"):
        load_settings(clickhouse_cluster="a-b", clickhouse_dsn="http://ch:8123/db")
    s = load_settings(clickhouse_cluster="crawl", clickhouse_dsn="http://ch:8123/db")
    assert s.clickhouse_cluster == "crawl"


def test_the_schema_command_prints_what_the_store_runs() -> None:
    from typer.testing import CliRunner

    from crawlfleet.cli import app
    out = CliRunner().invoke(app, ["schema", "--cluster", CLUSTER]).output
    assert out == render(CLUSTER)
    assert "ReplicatedReplacingMergeTree" in out and "Distributed(crawl" in out
