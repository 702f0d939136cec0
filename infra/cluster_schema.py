"""The ClickHouse cluster schema, generated from the embedded one so the two never drift.

``infra/sql/schema.sql`` and ``dashboards.sql`` are the one source of every table's columns,
keys and TTL. For a cluster each table becomes

- ``<name>_local``: a ``Replicated<Engine>`` on every replica (same columns, ORDER BY, TTL),
  ZooKeeper/Keeper path ``/clickhouse/tables/{shard}/{database}/<name>_local``;
- ``<name>``: a ``Distributed`` table over them for reads and inserts, sharded by a hash of
  the table's whole sorting key, so every version of a row lands on one shard and ``FINAL``
  (the ``*_v`` views) collapses them there;

and every statement carries ``ON CLUSTER``. Deduplication: replicated tables deduplicate
inserts by default (``replicated_deduplication_window``), and ``insert_deduplication_token``
(the store's batch token) is honoured by each shard's replicated table when the Distributed
insert is synchronous (``insert_distributed_sync = 1``, which the store sets on a cluster), so
the non-replicated window setting of the embedded tables is dropped here. Pure text in, text
out: tested by chDB's own parser (``formatQuery``), never against a live cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

SQL_DIR = Path(__file__).parent / "sql"
SOURCES = ("schema.sql", "dashboards.sql")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CREATE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)\s*ENGINE\s*=\s*(\w+)"
                     r"(?:\(([^)]*)\))?\s*(.*)", re.S)
_ALTER = re.compile(r"ALTER TABLE (\w+) (.*)", re.S)
_VIEW = re.compile(r"CREATE (OR REPLACE VIEW|VIEW IF NOT EXISTS) (\w+) AS\s+(.*)", re.S)


@dataclass(frozen=True)
class Table:
    """One table of the embedded schema, as its DDL declares it."""

    name: str
    columns: str  # the column list, as written
    engine: str  # e.g. ReplacingMergeTree
    engine_args: str  # e.g. fetched_at
    tail: str  # ORDER BY ..., TTL ..., SETTINGS ...

    @property
    def order_by(self) -> str:
        m = re.search(r"ORDER BY\s+(\(.*?\)|\S+)", self.tail, re.S)
        assert m is not None, f"{self.name}: no ORDER BY"
        return m.group(1).strip("()")


def statements(text: str) -> list[str]:
    """The statements of a SQL file (``--`` comment lines dropped)."""
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def embedded_statements() -> list[str]:
    return [s for name in SOURCES for s in statements((SQL_DIR / name).read_text())]


def tables(stmts: list[str] | None = None) -> list[Table]:
    out = []
    for stmt in stmts if stmts is not None else embedded_statements():
        m = _CREATE.fullmatch(stmt)
        if m:
            out.append(Table(m[1], m[2].strip(), m[3], (m[4] or "").strip(), m[5].strip()))
    return out


def cluster_statements(cluster: str, stmts: list[str] | None = None) -> list[str]:
    """The embedded schema's statements, for cluster ``cluster`` (see the module doc)."""
    if not _NAME.fullmatch(cluster):
        raise ConfigError(f"cluster name {cluster!r}: letters, digits and '_' only")
    on = f"ON CLUSTER {cluster}"
    out: list[str] = []
    for stmt in stmts if stmts is not None else embedded_statements():
        if (m := _CREATE.fullmatch(stmt)) is not None:
            t = Table(m[1], m[2].strip(), m[3], (m[4] or "").strip(), m[5].strip())
            out += _table(t, cluster, on)
        elif (m := _ALTER.fullmatch(stmt)) is not None:
            out += [f"ALTER TABLE {m[1]}_local {on} {m[2]}", f"ALTER TABLE {m[1]} {on} {m[2]}"]
        elif (m := _VIEW.fullmatch(stmt)) is not None:
            verb = "CREATE OR REPLACE VIEW" if m[1].startswith("OR") else \
                "CREATE VIEW IF NOT EXISTS"
            out.append(f"{verb} {m[2]} {on} AS {m[3]}")
        else:
            raise ConfigError(f"no cluster form for this statement of the schema: {stmt[:80]}")
    return out


def _table(t: Table, cluster: str, on: str) -> list[str]:
    local = f"{t.name}_local"
    path = f"'/clickhouse/tables/{{shard}}/{{database}}/{local}', '{{replica}}'"
    args = f"{path}, {t.engine_args}" if t.engine_args else path
    tail = re.sub(r"\s*SETTINGS\s+non_replicated_deduplication_window\s*=\s*\d+", "", t.tail)
    return [
        f"CREATE TABLE IF NOT EXISTS {local} {on} (\n    {t.columns}\n) "
        f"ENGINE = Replicated{t.engine}({args})\n{tail}".rstrip(),
        f"CREATE TABLE IF NOT EXISTS {t.name} {on} AS {local} ENGINE = Distributed("
        f"{cluster}, currentDatabase(), {local}, cityHash64({t.order_by}))",
    ]


def render(cluster: str) -> str:
    """The whole cluster schema as one SQL text (``crawlfleet schema --cluster NAME``)."""
    return ";\n\n".join(cluster_statements(cluster)) + ";\n"


def render_embedded() -> str:
    return ";\n\n".join(embedded_statements()) + ";\n"
