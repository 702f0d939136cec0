"""ClickHouse access: embedded chDB by default, a server when a DSN is given.

chDB admits one process per store path (its own file lock), so the process that owns the
store (the store worker) also serves read queries to others over a loopback HTTP endpoint
whose port it writes next to the store. Two flocks of ours, released by the kernel when
their holder dies, decide who may open the path:

- ``owner.lock``: the store worker's, for its whole life (from before it opens the path);
- ``open.lock``: whoever has the engine open -- the store worker, or a reader for the
  duration of one query when no store worker lives.

:func:`run_query` goes through the owner's endpoint whenever a store worker lives (waiting
a bounded time for it to serve) and opens the path itself only while holding
``open.lock`` with no owner alive, so a stale port file can never make a reader take the
store from a live worker, and a store worker that starts meanwhile waits, not fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver import options as _driver_options
from clickhouse_connect.driver.insert import InsertContext

from core.config import Settings
from core.errors import InfraError, RetryableError
from core.timefmt import iso_utc
from infra.clickhouse_errors import SchemaMissingError, classify
from infra.cluster_durability import insert_quorum_settings
from infra.cluster_schema import database_of, expected_objects, missing

# clickhouse-connect imports pandas on the first insert only to ask whether the rows are a
# DataFrame; ours are lists of tuples, and nothing here reads DataFrames. Said absent, it
# is never imported: 0.17 CPU-s at every store's start and ~40 MB of its memory.
_driver_options.pd = None
_driver_options.pd_time_test = None

log = logging.getLogger("crawlfleet.clickhouse")

SQL_DIR = Path(__file__).parent / "sql"
PORT_FILE = "query.port"
#: The query endpoint's secret, readable by the owner's user only: a request without it, or
#: from a browser (an ``Origin`` header), is refused.
TOKEN_FILE = "query.token"  # noqa: S105 - a file name, not a secret
TOKEN_HEADER = "X-Crawlfleet-Token"  # noqa: S105 - a header name
#: Every query from outside the store worker runs under these: reads only (no DDL, no
#: writes, no settings changes, and no table functions that reach out of the store --
#: ``url``, ``file``, ``remote``, ``s3`` ... are refused in readonly mode), stopped by the
#: engine past the time the endpoint's client waits (60 s) and past a memory budget, so no
#: reader starves the store worker serving it; the query's own SETTINGS clause cannot lift
#: them. ``readonly`` comes last: chDB applies a query's settings in order on a session that
#: keeps the previous query's readonly, so a limit after it is refused as a settings change
#: from the second query on. Result rows are capped by whoever shows them (the dashboard).
READ_ONLY_SETTINGS: dict[str, int] = {"max_execution_time": 60, "max_memory_usage": 1 << 30,
                                      "readonly": 1}
#: Held by the store worker for its whole life: while it is held, readers never open the path.
OWNER_LOCK = "owner.lock"
#: Held by whoever has the engine open (the store worker, or one reader for one query).
OPEN_LOCK = "open.lock"
#: Engine options of every embedded open (the first open of a path in a process starts the
#: engine with them). The engine's memory worker re-reads the allocator's statistics every 100 ms
#: by default: an idle store worker spent ~0.13 CPU-s a minute on that alone, ~0.025 at 1 s
#: (measured on chDB 4.4). Once a second still corrects the memory tracker long before a batch
#: could outgrow it.
CHDB_OPTIONS: dict[str, Any] = {"memory_worker_period_ms": 1000}
#: How long a reader waits for a living store worker to serve queries (it opens the store,
#: creates the schema and starts its endpoint: about a second on a small store).
READER_WAIT_S = 30.0

PAGE_COLUMNS = ("dedupe_key", "url", "final_url", "target", "profile", "depth", "status",
                "content_type", "title", "text", "links", "body_bytes", "fetched_at",
                "fetch_worker", "parse_worker", "parsed_at", "profile_bundle_version",
                "http_version", "tls_version", "code_revision")
EVENT_COLUMNS = ("event_id", "ts", "url", "target", "profile", "attempt", "status", "outcome",
                 "reason", "elapsed_ms", "bytes", "worker", "fetcher_version", "http_version",
                 "tls_version", "profile_bundle_version", "code_revision", "egress")
DEAD_COLUMNS = ("event_id", "failed_at", "url", "target", "profile", "source_topic", "reason",
                "error", "attempts", "worker", "version", "raw", "job")
VISIT_COLUMNS = ("dedupe_key", "visit", "url", "target", "profile", "visited_at", "status",
                 "outcome", "changed", "signature", "etag", "last_modified", "next_due_at",
                 "crawl", "parsed_at", "parse_worker")
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


@dataclass(frozen=True)
class Holder:
    """Who holds one of the store's locks, as the holder wrote it when it took the lock."""

    pid: int
    role: str  # "store worker" or "reader"
    command: str
    host: str
    since: float  # Unix time the lock was taken

    def describe(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{self.role} pid {self.pid} ({self.command}) since {since}"


class StoreHeldError(RetryableError):
    """The embedded store is held by another process: a moment (its exit) cures it."""

    reason = "store_held"

    def __init__(self, message: str, holder: Holder | None, by_owner: bool) -> None:
        super().__init__(message)
        self.holder = holder
        self.by_owner = by_owner  # a store worker lives: readers go through its endpoint


def _command() -> str:
    """This process's command line, short enough for a log line."""
    args = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
    if args[0] in ("cli.py", "__main__.py"):
        args[0] = "crawlfleet"
    elif args[0] == "-c":
        args[0] = "python -c"
    text = " ".join(args)
    return text if len(text) <= 120 else text[:117] + "..."


class PathLock:
    """An exclusive flock on one file, released by the kernel when its holder dies.

    The holder writes who it is into the file, for whoever finds the lock taken; that text
    means something only while the lock is held (a dead holder's stays behind).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held_here(self) -> bool:
        return self._fd is not None

    def acquire(self, role: str, tries: int = 1) -> bool:
        """Take the lock without blocking (``tries`` times, 10 ms apart); False if taken.

        Several tries ride out another process's momentary :meth:`held` test."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        for attempt in range(tries):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == tries - 1:
                    os.close(fd)
                    return False
                time.sleep(0.01)
        me = {"pid": os.getpid(), "role": role, "command": _command(),
              "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no stale holder left behind (still ours until closed)
            os.close(fd)

    def held(self) -> bool:
        """Whether some process holds the lock (tested with a shared lock, given back at once)."""
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing gives a shared lock back
        return False

    def holder(self) -> Holder | None:
        """Who wrote themselves into the lock file last (None: nobody readable)."""
        try:
            data = json.loads(self.path.read_bytes() or b"null")
            return Holder(int(data["pid"]), str(data["role"]), str(data["command"]),
                          str(data["host"]), float(data["since"]))
        except (OSError, ValueError, TypeError, KeyError):
            return None


class StoreOwnership:
    """The store worker's claim on an embedded store path, held for the worker's life.

    While it is held, readers never open the path (they use the owner's endpoint, or wait
    for it), so a reader can never take the store from under a starting or running worker.
    """

    def __init__(self, settings: Settings) -> None:
        self.path = settings.clickhouse_path
        self.lock = PathLock(self.path / OWNER_LOCK)

    def claim(self) -> bool:
        """Claim the store (idempotent); False while another store worker owns it."""
        if self.lock.held_here:
            return True
        if not self.lock.acquire("store worker", tries=3):
            return False
        # The owner before us is dead: the port file it left says nothing any more.
        (self.path / PORT_FILE).unlink(missing_ok=True)
        return True

    def holder(self) -> Holder | None:
        """The store worker that owns the store (as it wrote itself into the lock)."""
        return self.lock.holder()

    def release(self) -> None:
        self.lock.release()


class Store:
    """A clickhouse-connect client plus crawlfleet's schema; thread-safe via one lock.

    Embedded, the store is opened under ``open.lock``; a reader (``owner`` False) also
    refuses while a store worker owns the path (:class:`StoreOwnership`). Either refusal
    is a :class:`StoreHeldError` naming the holder.
    """

    def __init__(self, settings: Settings, *, owner: bool = False) -> None:
        self._lock = threading.Lock()
        self._contexts: dict[tuple[str, tuple[str, ...]], InsertContext] = {}
        self.embedded = not settings.clickhouse_dsn.get()
        self.cluster = settings.clickhouse_cluster if not self.embedded else ""
        self.database = database_of(settings.clickhouse_dsn.get()) if self.cluster else ""
        self.path = settings.clickhouse_path
        #: Settings of every insert besides its token: on a cluster, the quorum.
        self._insert_settings = insert_quorum_settings(settings) if self.cluster else {}
        self._where = "the embedded store" if self.embedded else _server_of(settings)
        self._open_lock: PathLock | None = None
        if self.embedded:
            self._open_lock = self._take(settings, owner)
        try:
            if self.embedded:
                self._client = clickhouse_connect.get_client(interface="chdb",
                                                             path=str(self.path),
                                                             chdb_options=CHDB_OPTIONS)
            else:
                # On a cluster, inserts go through Distributed tables synchronously, so each
                # batch's deduplication token (and its quorum) reaches the shard's replicated
                # table. Every request is bounded: a server that accepts and never answers
                # is "unavailable" after clickhouse_timeout_s, never a hung worker.
                extra = {"insert_distributed_sync": 1} if self.cluster else None
                self._client = clickhouse_connect.get_client(
                    dsn=settings.clickhouse_dsn.get(), settings=extra,
                    connect_timeout=settings.clickhouse_timeout_s,
                    send_receive_timeout=settings.clickhouse_timeout_s)
        except Exception as exc:  # chDB/driver raise many types; surface one clear error
            if self._open_lock is not None:
                self._open_lock.release()
            if not self.embedded and (known := classify(exc, self._where)) is not None:
                raise known from exc
            where = self.path if self.embedded else "the configured DSN"
            raise InfraError(f"cannot open ClickHouse at {where}: {exc}") from exc

    def _take(self, settings: Settings, owner: bool) -> PathLock:
        self.path.mkdir(parents=True, exist_ok=True)
        if not owner:
            owned = PathLock(self.path / OWNER_LOCK)
            if owned.held():
                holder = owned.holder()
                raise StoreHeldError(f"the store at {self.path} is owned by "
                                     f"{_who(holder, 'a store worker')}", holder, True)
        lock = PathLock(self.path / OPEN_LOCK)
        if not lock.acquire("store worker" if owner else "reader", tries=3 if owner else 1):
            holder = lock.holder()
            raise StoreHeldError(f"the store at {self.path} is open in "
                                 f"{_who(holder, 'another process')}", holder,
                                 holder is not None and holder.role == "store worker")
        return lock

    def ensure_schema(self) -> None:
        """The tables and views, made or brought up to date (idempotent). On a cluster, only
        checked (:meth:`check_schema`): its schema is applied once, by ``crawlfleet schema
        --cluster NAME --apply``, never by every store start (each ON CLUSTER statement
        waits for every host, and a host down would stop every start)."""
        if self.cluster:
            self.check_schema()
            return
        for name in ("schema.sql", "dashboards.sql"):
            for stmt in _statements((SQL_DIR / name).read_text()):
                self.command(stmt)

    def check_schema(self) -> None:
        """Raise :class:`SchemaMissingError` naming what of the cluster schema is not in the
        DSN's database on the server: two cheap reads of ``system.tables`` and
        ``system.columns``. Also the store's probe of a server it waits for."""
        expected = expected_objects()
        db = self.database  # a checked identifier (database_of)
        _, rows = self.query(f"SELECT name FROM system.tables WHERE database = '{db}'")  # noqa: S608
        found: dict[str, set[str]] = {str(r[0]): set() for r in rows}
        _, rows = self.query("SELECT table, name FROM system.columns "  # noqa: S608
                             f"WHERE database = '{db}'")
        for table, column in rows:
            found.setdefault(str(table), set()).add(str(column))
        gone = missing(expected, {k: v for k, v in found.items() if k in expected})
        if gone:
            shown = ", ".join(gone[:6]) + (f" and {len(gone) - 6} more" if len(gone) > 6
                                           else "")
            raise SchemaMissingError(
                f"the cluster schema is not (all) in database {db} at {self._where}: "
                f"missing {shown}; apply it once with `crawlfleet schema --cluster "
                f"{self.cluster} --apply`")

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

    def _failed(self, exc: Exception) -> None:
        """Raise what a server's failure means to the store (see :mod:`infra.clickhouse_errors`);
        return for one to surface as it is (the embedded engine's, or a bug's)."""
        if not self.embedded and (known := classify(exc, self._where)) is not None:
            raise known from exc

    def command(self, sql: str) -> None:
        with self._lock:
            try:
                self._client.command(sql)
            except Exception as exc:
                self._failed(exc)
                raise

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
            ctx.settings = {**self._insert_settings, "insert_deduplication_token": token}
            try:
                self._client.insert(context=ctx)
            except Exception as exc:
                del self._contexts[key]  # its state is unknown now: build a fresh one
                self._failed(exc)
                raise

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._lock:
            try:
                result = self._client.query(sql)
            except Exception as exc:
                self._failed(exc)
                raise
        return list(result.column_names), [tuple(r) for r in result.result_rows]

    def read_only_query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """``sql`` as a reader's query: :data:`READ_ONLY_SETTINGS` on the embedded store (a
        server's DSN user carries its own grants)."""
        with self._lock:
            result = self._client.query(sql, settings=READ_ONLY_SETTINGS if self.embedded
                                        else None)
        return list(result.column_names), [tuple(r) for r in result.result_rows]

    def scalar(self, sql: str) -> Any:
        _, rows = self.query(sql)
        return rows[0][0] if rows else None

    def close(self) -> None:
        with self._lock:
            try:
                self._client.close()
            finally:
                if self._open_lock is not None:
                    self._open_lock.release()  # after chDB let go of the path


def _server_of(settings: Settings) -> str:
    """host:port of the DSN, for messages (never its credentials)."""
    parsed = urlparse(settings.clickhouse_dsn.get())
    host = parsed.hostname or "?"
    return f"{host}:{parsed.port}" if parsed.port else host


def _who(holder: Holder | None, unknown: str) -> str:
    return holder.describe() if holder is not None else unknown


def _statements(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return iso_utc(v)
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v
