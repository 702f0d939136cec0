"""ClickHouse access: embedded chDB by default, a server when a DSN is given.

chDB allows one process per store path (file lock), so the process that owns the store
(the store worker) also serves read queries to others over a loopback HTTP endpoint whose
port it writes next to the store. :func:`run_query` uses that endpoint when it answers and
opens the path itself otherwise (e.g. after the crawl has finished).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Sequence
from datetime import UTC, date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError
from clickhouse_connect.driver.insert import InsertContext

from crawlfleet.config import Settings
from crawlfleet.errors import ConfigError, InfraError, QueryError

SQL_DIR = Path(__file__).parent / "sql"
PORT_FILE = "query.port"

PAGE_COLUMNS = ("dedupe_key", "url", "final_url", "target", "profile", "depth", "status",
                "content_type", "title", "text", "links", "body_bytes", "fetched_at",
                "fetch_worker", "parse_worker", "parsed_at")
EVENT_COLUMNS = ("event_id", "ts", "url", "target", "profile", "attempt", "status", "outcome",
                 "reason", "elapsed_ms", "bytes", "worker", "fetcher_version", "http_version",
                 "tls_version", "profile_bundle_version", "code_revision")
DEAD_COLUMNS = ("event_id", "failed_at", "url", "target", "profile", "source_topic", "reason",
                "error", "attempts", "worker", "version", "raw", "job")
LINEAGE_COLUMNS = ("event_id", "ts", "dedupe_key", "url", "target", "profile", "state",
                   "attempt", "parent_url", "detail", "stage", "worker", "version")

#: Telemetry events that stand for no page request (refused before one was sent).
NO_REQUEST_REASONS = ("robots_disallowed", "robots_unreachable", "address_not_allowed",
                      "invalid_url")


def job_duration_sql(window_s: float) -> str:
    """Count, p50/p95/p99 and max of page-request durations (ms) over the last ``window_s``
    (as the ``dash_job_durations`` view, per hour)."""
    skip = ", ".join(f"'{r}'" for r in NO_REQUEST_REASONS)
    since = f"now64(3) - toIntervalSecond({int(window_s)})"
    # Built from constants and an int only.
    where = f"WHERE ts >= {since} AND reason NOT IN ({skip})"
    return ("SELECT count(), quantilesExact(0.5, 0.95, 0.99)(elapsed_ms), max(elapsed_ms) "
            "FROM fetch_events_v " + where)


class Store:
    """A clickhouse-connect client plus crawlfleet's schema; thread-safe via one lock."""

    def __init__(self, settings: Settings) -> None:
        self._lock = threading.Lock()
        self._contexts: dict[tuple[str, tuple[str, ...]], InsertContext] = {}
        self.embedded = not settings.clickhouse_dsn.get()
        self.path = settings.clickhouse_path
        try:
            if self.embedded:
                self.path.mkdir(parents=True, exist_ok=True)
                self._client = clickhouse_connect.get_client(interface="chdb",
                                                             path=str(self.path))
            else:
                self._client = clickhouse_connect.get_client(dsn=settings.clickhouse_dsn.get())
        except Exception as exc:  # chDB/driver raise many types; surface one clear error
            where = self.path if self.embedded else "the configured DSN"
            raise InfraError(f"cannot open ClickHouse at {where}: {exc}") from exc

    def ensure_schema(self) -> None:
        for name in ("schema.sql", "dashboards.sql"):
            for stmt in _statements((SQL_DIR / name).read_text()):
                self.command(stmt)

    def warm_up(self) -> None:
        """Pay chDB's one-time set-up of its first insert (~0.2 CPU-s) now, not on the
        first batch of pages, where it would delay the crawl's first stored results.

        Uses a scratch table; only for the embedded engine, whose store this process owns.
        """
        if not self.embedded:
            return
        with self._lock:
            self._client.command("CREATE TABLE IF NOT EXISTS _crawlfleet_warm_up (n UInt8) "
                                 "ENGINE = MergeTree ORDER BY tuple()")
            self._client.insert("_crawlfleet_warm_up", [(1,)], column_names=["n"])
            self._client.command("DROP TABLE _crawlfleet_warm_up SYNC")

    def command(self, sql: str) -> None:
        with self._lock:
            self._client.command(sql)

    def insert(self, table: str, columns: Sequence[str], rows: list[Sequence[Any]],
               token: str) -> None:
        """Insert one block; a repeat of the same ``token`` is dropped by ClickHouse."""
        if not rows:
            return
        key = (table, tuple(columns))
        with self._lock:
            # One insert context per table: without it every insert first asks the server
            # for the table's column types (a query of its own, ~2 ms on chDB).
            ctx = self._contexts.get(key)
            if ctx is None:
                ctx = self._contexts[key] = self._client.create_insert_context(
                    table, column_names=list(columns))
            ctx.data = rows
            ctx.settings = {"insert_deduplication_token": token}
            try:
                self._client.insert(context=ctx)
            except Exception:
                del self._contexts[key]  # its state is unknown now: build a fresh one
                raise

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._lock:
            result = self._client.query(sql)
        return list(result.column_names), [tuple(r) for r in result.result_rows]

    def scalar(self, sql: str) -> Any:
        _, rows = self.query(sql)
        return rows[0][0] if rows else None

    def close(self) -> None:
        with self._lock:
            self._client.close()


def _statements(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).isoformat()
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


class QueryServer:
    """Serves read queries of the store's owner process on 127.0.0.1 (embedded mode only)."""

    def __init__(self, store: Store, port_dir: Path) -> None:
        self._store = store
        self._port_file = port_dir / PORT_FILE
        store_ref = store

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sql = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                try:
                    cols, rows = store_ref.query(sql)
                    body = json.dumps({"columns": cols,
                                       "rows": [[_jsonable(v) for v in r] for r in rows]})
                    code = 200
                except Exception as exc:  # report any SQL error to the caller, keep serving
                    body, code = json.dumps({"error": str(exc)}), 400
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="store-query-server")

    def start(self) -> None:
        self._thread.start()
        self._port_file.write_text(str(self._server.server_address[1]))

    def stop(self) -> None:
        self._port_file.unlink(missing_ok=True)
        self._server.shutdown()
        self._server.server_close()


def run_query(settings: Settings, sql: str) -> tuple[list[str], list[list[Any]]]:
    """Run a query against the crawl's store, through its owner process if it is running.

    An engine error is a :class:`QueryError` with the engine's first line, never a trace."""
    try:
        return _run_query(settings, sql)
    except ClickHouseError as exc:
        raise QueryError(engine_message(str(exc))) from exc


def engine_message(text: str) -> str:
    """The engine's reason without its code prefix and echo of the query (one line)."""
    line = text.strip().splitlines()[0] if text.strip() else "query failed"
    line = re.sub(r"^.*?DB::Exception: ", "", line)
    return re.sub(r"\s*In scope .*?(\([A-Z_]+\))?$", r" \1", line).strip()


def _run_query(settings: Settings, sql: str) -> tuple[list[str], list[list[Any]]]:
    if settings.clickhouse_dsn.get():
        store = Store(settings)
        try:
            cols, rows = store.query(sql)
            return cols, [[_jsonable(v) for v in r] for r in rows]
        finally:
            store.close()
    port_file = settings.clickhouse_path / PORT_FILE
    if port_file.exists():
        try:
            return _remote_query(int(port_file.read_text()), sql)
        except OSError:
            pass  # owner gone (stale port file): open the path ourselves
    if not settings.clickhouse_path.exists():
        raise ConfigError(f"no crawl store at {settings.clickhouse_path}; run a crawl first "
                          "or pass --data-dir / --clickhouse")
    store = Store(settings)
    try:
        cols, rows = store.query(sql)
        return cols, [[_jsonable(v) for v in r] for r in rows]
    finally:
        store.close()


def _remote_query(port: int, sql: str) -> tuple[list[str], list[list[Any]]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=sql.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback only
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        payload = json.loads(exc.read())
        raise QueryError(engine_message(str(payload.get("error")))) from exc
    return payload["columns"], payload["rows"]
