"""The ClickHouse cluster schema, generated from the embedded one so the two never drift.

``infra/sql/schema.sql`` and ``dashboards.sql`` are the one source of every table's columns,
keys and TTL. For a cluster each table becomes

- ``<name>_local``: a ``Replicated<Engine>`` on every replica (same columns, ORDER BY, TTL),
  ZooKeeper/Keeper path ``/clickhouse/tables/{shard}/{database}/<name>_local``;
- ``<name>``: a ``Distributed`` table over them for reads and inserts, sharded by a hash of
  the table's whole sorting key, so every version of a row lands on one shard and ``FINAL``
  (the ``*_v`` views) collapses them there;

and every statement carries ``ON CLUSTER``, preceded by ``CREATE DATABASE IF NOT EXISTS db ON
CLUSTER c``. Every name is qualified with the database (the DSN's): ClickHouse's DDL worker
runs each statement on each host against that host's default database, so an unqualified
``AS <t>_local``, a view's ``FROM <t>`` or ``currentDatabase()`` in ``Distributed(...)``
resolve there, not in the database the operator meant (ClickHouse issues #6104, #18783,
#37318, #39500: "Table default.test_local doesn't exist").

Deduplication: the store's batch token (``insert_deduplication_token``) reaches each shard's
replicated table because the Distributed insert is synchronous (``insert_distributed_sync``,
set by the store on a cluster); the replicated tables' windows are explicit
(:func:`infra.cluster_durability.dedup_window`), in place of the embedded tables'
``non_replicated_deduplication_window``.

The schema is applied once, by ``crawlfleet schema --cluster NAME --apply``
(:mod:`infra.cluster_apply`), never by a store worker: a store worker only checks that every
object and column is there (:func:`missing`) and waits while some are not. Pure text in,
text out: tested by chDB's own parser (``formatQuery``), never against a live cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from core.config import Settings
from core.errors import ConfigError
from infra.cluster_durability import DedupWindow, dedup_window

SQL_DIR = Path(__file__).parent / "sql"
SOURCES = ("schema.sql", "dashboards.sql")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CREATE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)\s*ENGINE\s*=\s*(\w+)"
                     r"(?:\(([^)]*)\))?\s*(.*)", re.S)
_ALTER = re.compile(r"ALTER TABLE (\w+) (.*)", re.S)
#: A sorting key extended by the ALTER that adds its column (only the replicated table has one).
_MODIFY_ORDER = re.compile(r",?\s*MODIFY ORDER BY\s+(\(.*?\)|\S+)", re.S)
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


def database_of(dsn: str) -> str:
    """The database a ClickHouse DSN names (``http://u:p@host:8123/db``): ``default`` if none."""
    path = urlparse(dsn).path if dsn else ""
    name = unquote(path[1:].split("/")[0]) if path else ""
    return _checked("database", name or "default")


def _checked(what: str, name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{what} name {name!r}: letters, digits and '_' only")
    return name


def default_window() -> DedupWindow:
    """The windows for the default settings (what ``crawlfleet schema`` prints unconfigured)."""
    return dedup_window(Settings())


def cluster_statements(cluster: str, database: str = "default", *,
                       window: DedupWindow | None = None,
                       stmts: list[str] | None = None) -> list[str]:
    """The embedded schema's statements for cluster ``cluster``, every name in ``database``
    (see the module doc), replicated tables deduplicating within ``window``."""
    _checked("cluster", cluster)
    db = _checked("database", database)
    win = window if window is not None else default_window()
    on = f"ON CLUSTER {cluster}"
    source = stmts if stmts is not None else embedded_statements()
    known = _object_names(source)
    out: list[str] = [f"CREATE DATABASE IF NOT EXISTS {db} {on}"]
    for stmt in source:
        if (m := _CREATE.fullmatch(stmt)) is not None:
            t = Table(m[1], m[2].strip(), m[3], (m[4] or "").strip(), m[5].strip())
            out += _table(t, cluster, db, on, win)
        elif (m := _ALTER.fullmatch(stmt)) is not None:
            out.append(f"ALTER TABLE {db}.{m[1]}_local {on} {m[2]}")
            if (rest := _MODIFY_ORDER.sub("", m[2]).strip()):  # a Distributed table has no key
                out.append(f"ALTER TABLE {db}.{m[1]} {on} {rest}")
        elif (m := _VIEW.fullmatch(stmt)) is not None:
            verb = "CREATE OR REPLACE VIEW" if m[1].startswith("OR") else \
                "CREATE VIEW IF NOT EXISTS"
            out.append(f"{verb} {db}.{m[2]} {on} AS {_qualified(m[3], db, known)}")
        else:
            raise ConfigError(f"no cluster form for this statement of the schema: {stmt[:80]}")
    return out


def _object_names(stmts: list[str]) -> set[str]:
    names = {m[1] for s in stmts if (m := _CREATE.fullmatch(s)) is not None}
    return names | {m[2] for s in stmts if (m := _VIEW.fullmatch(s)) is not None}


_SOURCE = re.compile(r"\b(FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*[.(])", re.I)


def _qualified(select: str, db: str, known: set[str]) -> str:
    """``select`` with each table or view of the schema it reads named in ``db``."""
    return _SOURCE.sub(lambda m: f"{m[1]} {db}.{m[2]}" if m[2] in known else m[0], select)


def _table(t: Table, cluster: str, db: str, on: str, win: DedupWindow) -> list[str]:
    local = f"{t.name}_local"
    path = f"'/clickhouse/tables/{{shard}}/{{database}}/{local}', '{{replica}}'"
    args = f"{path}, {t.engine_args}" if t.engine_args else path
    tail = re.sub(r"\s*SETTINGS\s+non_replicated_deduplication_window\s*=\s*\d+", "", t.tail)
    if "SETTINGS" in tail:
        raise ConfigError(f"{t.name}: table settings besides the deduplication window have "
                          "no cluster form yet")
    return [
        f"CREATE TABLE IF NOT EXISTS {db}.{local} {on} (\n    {t.columns}\n) "
        f"ENGINE = Replicated{t.engine}({args})\n{tail}\nSETTINGS {win.table_settings()}",
        f"CREATE TABLE IF NOT EXISTS {db}.{t.name} {on} AS {db}.{local} ENGINE = Distributed("
        f"{cluster}, {db}, {local}, cityHash64({t.order_by}))",
    ]


def render(cluster: str, database: str = "default", window: DedupWindow | None = None) -> str:
    """The whole cluster schema as one SQL text (``crawlfleet schema --cluster NAME``)."""
    return ";\n\n".join(cluster_statements(cluster, database, window=window)) + ";\n"


# --- what a store worker checks ----------------------------------------------------------


def column_names(columns: str) -> tuple[str, ...]:
    """The names in a column list as written (``a String, b DateTime64(3, 'UTC') DEFAULT 0``)."""
    names: list[str] = []
    piece: list[str] = []
    depth = 0
    for ch in columns + ",":
        if ch == "," and depth == 0:
            text = "".join(piece).strip()
            if text:
                names.append(text.split()[0].strip("`"))
            piece = []
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        piece.append(ch)
    return tuple(names)


_ADD_COLUMN = re.compile(r"ADD COLUMN IF NOT EXISTS\s+`?(\w+)`?", re.I)


def expected_objects(stmts: list[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Every object of the cluster schema a store needs, by name, with its columns (a view:
    none checked): ``<t>_local`` and ``<t>`` with the table's columns (those an ALTER adds
    included), and each view."""
    source = stmts if stmts is not None else embedded_statements()
    out: dict[str, tuple[str, ...]] = {}
    for t in tables(source):
        out[f"{t.name}_local"] = out[t.name] = column_names(t.columns)
    for stmt in source:
        if (m := _ALTER.fullmatch(stmt)) is not None:
            added = tuple(c for c in _ADD_COLUMN.findall(m[2]) if c not in out[m[1]])
            out[f"{m[1]}_local"] = out[m[1]] = out[m[1]] + added
        elif (m := _VIEW.fullmatch(stmt)) is not None:
            out[m[2]] = ()
    return out


def missing(expected: Mapping[str, tuple[str, ...]],
            found: Mapping[str, set[str]]) -> list[str]:
    """What of ``expected`` is not in ``found`` (object -> its columns, as the server lists
    them): "pages_local", "fetch_events.egress" ...; empty: the schema is there."""
    out: list[str] = []
    for name, columns in expected.items():
        if name not in found:
            out.append(name)
            continue
        out += [f"{name}.{c}" for c in columns if c not in found[name]]
    return out


def render_embedded() -> str:
    return ";\n\n".join(embedded_statements()) + ";\n"
