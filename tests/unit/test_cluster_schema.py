"""The cluster schema, from the same source as the embedded one: every statement parses in
chDB's own parser, and each replicated table has exactly the embedded table's columns, types,
defaults, sorting key and TTL (made in chDB with the replication stripped, then compared).
Every name is qualified with the DSN's database (the DDL worker resolves an unqualified one
in each host's default database), the database is made first, and every replicated table
deduplicates for longer than a store batch can be retried."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from core.config import load_settings
from core.errors import ConfigError
from infra.clickhouse import Store
from infra.clickhouse_errors import SchemaMissingError
from infra.cluster_durability import (
    dedup_window,
    insert_quorum_settings,
    store_retry_horizon_s,
)
from infra.cluster_schema import (
    cluster_statements,
    database_of,
    embedded_statements,
    expected_objects,
    missing,
    render,
    tables,
)

CLUSTER = "crawl"
DB = "crawl_db"
REPO = Path(__file__).resolve().parents[2]


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
    stmts = cluster_statements(CLUSTER, DB)
    assert len(stmts) > len(embedded_statements())  # each table: a local and a distributed
    for stmt in stmts:
        formatted = store.scalar(f"SELECT formatQuery({_sql_string(stmt)})")
        assert f"ON CLUSTER {CLUSTER}" in formatted, stmt


def _plain(stmt: str) -> str:
    """A cluster statement as one chDB can run: no ON CLUSTER, no replication, and each
    Distributed table a Merge over its local table (same columns, read-through)."""
    plain = stmt.replace(f" ON CLUSTER {CLUSTER}", "")
    plain = re.sub(r"ENGINE = Replicated(\w+)\('[^']*', '[^']*'(?:, )?", r"ENGINE = \1(",
                   plain)
    return re.sub(r"ENGINE = Distributed\(\w+, (\w+), (\w+), .*\)$",
                  r"ENGINE = Merge(\1, '^\2$')", plain)


def test_each_replicated_table_matches_its_embedded_table(store: Store) -> None:
    made = 0
    for stmt in cluster_statements(CLUSTER, DB):
        store.command(_plain(stmt))
        m = re.match(rf"CREATE TABLE IF NOT EXISTS {DB}\.(\w+)_local ON CLUSTER \w+ ", stmt)
        if not m:
            continue
        name = m[1]
        made += 1
        cols = ("SELECT name, type, default_kind, default_expression FROM system.columns "
                "WHERE database = '{}' AND table = '{}' ORDER BY position")
        assert store.query(cols.format(DB, f"{name}_local"))[1] == \
            store.query(cols.format("default", name))[1]
        keys = ("SELECT sorting_key, engine, replaceRegexpAll(create_table_query, "
                "'.*(TTL [^S]*).*|.*', '\\\\1') FROM system.tables "
                "WHERE database = '{}' AND name = '{}'")
        assert store.query(keys.format(DB, f"{name}_local"))[1] == \
            store.query(keys.format("default", name))[1]
    assert made == len(tables()) >= 5


def test_a_clusters_page_visits_made_before_crawls_were_kept_gains_the_key(
        store: Store) -> None:
    """Applying the schema again extends the replicated table's sorting key with ``crawl``
    in place (issue 44); the Distributed table, which has none, only gains the column."""
    store.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    store.command(f"CREATE TABLE {DB}.page_visits_local (dedupe_key String, visit UInt32, "
                  "visited_at DateTime64(3, 'UTC')) ENGINE = ReplacingMergeTree(visited_at) "
                  "ORDER BY (dedupe_key, visit)")
    stmts = cluster_statements(CLUSTER, DB)
    alters = [s for s in stmts if "MODIFY ORDER BY" in s]
    assert alters and all(f"{DB}.page_visits_local " in s for s in alters), alters
    for stmt in stmts:
        store.command(_plain(stmt))
    assert store.scalar("SELECT sorting_key FROM system.tables WHERE database = "
                        f"'{DB}' AND name = 'page_visits_local'") == "dedupe_key, visit, crawl"
    assert "crawl" in {str(r[0]) for r in store.query(
        f"SELECT name FROM system.columns WHERE database = '{DB}' AND table = 'page_visits'")[1]}


def test_every_name_is_in_the_dsns_database_and_it_is_made_first(store: Store) -> None:
    """The DDL worker runs each statement against each host's default database: nothing
    may be left for it to resolve there. Shown in chDB, whose current database (default)
    holds the embedded tables of the same names: the cluster schema's views read the
    cluster database's tables, never those."""
    stmts = cluster_statements(CLUSTER, DB)
    assert stmts[0] == f"CREATE DATABASE IF NOT EXISTS {DB} ON CLUSTER {CLUSTER}"
    text = "\n".join(stmts)
    assert "currentDatabase()" not in text
    for stmt in stmts[1:]:
        head = re.match(r"(CREATE TABLE IF NOT EXISTS|ALTER TABLE|CREATE OR REPLACE VIEW|"
                        r"CREATE VIEW IF NOT EXISTS) (\S+) ON CLUSTER ", stmt)
        assert head and head[2].startswith(f"{DB}."), stmt[:100]
        if "VIEW" in stmt.split(" AS ", 1)[0]:  # every table a view reads: in DB
            refs = re.findall(r"\b(?:FROM|JOIN)\s+([A-Za-z_][\w.]*)", stmt)
            assert refs and all(r.startswith(f"{DB}.") for r in refs), stmt[:120]
    for t in tables():
        assert (f"CREATE TABLE IF NOT EXISTS {DB}.{t.name} ON CLUSTER {CLUSTER} AS "
                f"{DB}.{t.name}_local ENGINE = Distributed({CLUSTER}, {DB}, {t.name}_local, "
                f"cityHash64({t.order_by}))") in text
    assert "non_replicated_deduplication_window" not in text
    assert (f"CREATE OR REPLACE VIEW {DB}.pages_v ON CLUSTER {CLUSTER} AS SELECT * FROM "
            f"{DB}.pages FINAL") in stmts
    for stmt in stmts:
        store.command(_plain(stmt))
    store.command(f"INSERT INTO {DB}.pages_local (dedupe_key, url) VALUES ('k', 'u')")
    # the embedded pages (default database) is empty; the cluster database's has one row
    assert store.scalar(f"SELECT count() FROM {DB}.pages_v") == 1
    assert store.scalar(f"SELECT sum(pages) FROM {DB}.dash_pages_per_minute") == 1
    assert store.scalar("SELECT count() FROM pages_v") == 0
    found: dict[str, set[str]] = {}
    for table, column in store.query(f"SELECT table, name FROM system.columns "
                                     f"WHERE database = '{DB}'")[1]:
        found.setdefault(table, set()).add(column)
    assert missing(expected_objects(), found) == []
    # The store worker's own check (two reads of system.tables/columns), on the engine:
    # complete, it passes; a column short (an upgrade not applied yet), it names it.
    store.cluster, store.database = CLUSTER, DB
    store.check_schema()
    store.command(f"ALTER TABLE {DB}.lineage_local DROP COLUMN detail")
    store.command(f"DROP VIEW {DB}.dash_job_durations")
    with pytest.raises(SchemaMissingError, match=r"missing lineage_local\.detail, "
                       r"dash_job_durations; apply it once with `crawlfleet schema "
                       rf"--cluster {CLUSTER} --apply`"):
        store.check_schema()


def test_the_store_finds_what_is_missing_by_name() -> None:
    expected = expected_objects()
    assert expected["pages_local"] == expected["pages"]
    assert "code_revision" in expected["pages"] and "job" in expected["dead_letters"]
    full = {name: set(cols) for name, cols in expected.items()}
    assert missing(expected, full) == []
    partial = {k: set(v) for k, v in full.items() if k != "lineage_local"}
    partial["fetch_events"] = full["fetch_events"] - {"code_revision"}
    assert missing(expected, partial) == ["fetch_events.code_revision", "lineage_local"]
    assert missing(expected, {}) == list(expected)


def test_replicated_dedup_windows_outlast_a_store_batchs_retries() -> None:
    s = load_settings()
    horizon = store_retry_horizon_s(s)
    # the lease, the session timeout, a batch's fill and its six inserts' timeouts
    assert horizon == 300 + 30 + 0.25 + 6 * 30
    win = dedup_window(s)
    assert win.seconds > horizon and win.seconds % 60 == 0
    # two store workers, a batch every 0.15 s at most, for the whole window
    assert win.blocks >= 2 * win.seconds / 0.15
    local = [st for st in cluster_statements(CLUSTER, DB) if "_local ON CLUSTER" in st
             and st.startswith("CREATE TABLE")]
    assert len(local) == len(tables())
    for stmt in local:
        assert stmt.endswith(f"SETTINGS replicated_deduplication_window = {win.blocks}, "
                             f"replicated_deduplication_window_seconds = {win.seconds}"), stmt
    slower = s.replace(max_poll_interval_ms=900_000, clickhouse_timeout_s=60.0)
    assert dedup_window(slower).seconds > store_retry_horizon_s(slower) > horizon
    assert dedup_window(s, store_workers=6).blocks == 3 * win.blocks


def test_store_inserts_on_a_cluster_wait_for_a_majority_of_replicas() -> None:
    s = load_settings(clickhouse_cluster="crawl", clickhouse_dsn="http://ch:8123/db")
    quorum = insert_quorum_settings(s)
    assert quorum["insert_quorum"] == "auto" and quorum["insert_quorum_parallel"] == 1
    # the server's quorum timeout answers before the client's own timeout gives up
    assert 0 < quorum["insert_quorum_timeout"] < s.clickhouse_timeout_s * 1000


def test_the_database_is_the_dsns() -> None:
    assert database_of("http://u:p@ch:8123/crawl") == "crawl"
    assert database_of("https://ch:8443") == database_of("") == "default"
    with pytest.raises(ConfigError):
        database_of("http://ch:8123/a-b")
    with pytest.raises(ConfigError):
        cluster_statements(CLUSTER, "x; DROP TABLE pages")


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


def test_the_schema_command_prints_what_apply_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from crawlfleet.cli import app
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    out = CliRunner().invoke(app, ["schema", "--cluster", CLUSTER]).output
    assert out == render(CLUSTER, "default")
    assert "ReplicatedReplacingMergeTree" in out and "Distributed(crawl, default" in out
    dsn = CliRunner().invoke(app, ["schema", "--cluster", CLUSTER, "--clickhouse",
                                   "http://u:p@ch:8123/crawl"]).output
    assert dsn.startswith(f"CREATE DATABASE IF NOT EXISTS crawl ON CLUSTER {CLUSTER};")
    refused = CliRunner().invoke(app, ["schema", "--apply"])
    assert refused.exit_code == 2 and "--cluster" in refused.output


def test_the_runbook_and_readme_give_the_windows_the_code_sets() -> None:
    win = dedup_window(load_settings())
    for doc in (REPO / "infra" / "RUNBOOK.md", REPO / "README.md"):
        text = doc.read_text()
        assert f"{win.seconds:,} s" in text and f"{win.blocks:,} blocks" in text, doc
        assert "crawlfleet schema --cluster" in text and "insert_quorum = 'auto'" in text
