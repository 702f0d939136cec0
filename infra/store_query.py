"""Reading a store another process owns: the store worker's query endpoint (a loopback
HTTP server behind a token file readable by its user only, read-only settings on every
query) and the reader's side (``run_query``: through the owner's endpoint while a store
worker lives, else the engine opened directly for one query under ``open.lock``)."""

from __future__ import annotations

import hmac
import http.client
import json
import os
import re
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError

from core.config import Settings
from core.errors import ConfigError, InfraError, QueryError, RetryableError
from infra.clickhouse import (
    CHDB_OPTIONS,
    PORT_FILE,
    READ_ONLY_SETTINGS,
    READER_WAIT_S,
    TOKEN_FILE,
    TOKEN_HEADER,
    Store,
    StoreHeldError,
    _jsonable,
    log,
)

#: How often the query server's loop checks whether it was asked to shut down.
SHUTDOWN_POLL_S = 0.05


class QueryServer:
    """Serves read queries of the store's owner process on 127.0.0.1 (embedded mode only).

    Not an open door to the store: every request must carry the token from
    :data:`TOKEN_FILE` (mode 0600, written before the port file), a request carrying a
    browser ``Origin`` is refused (a web page can post to loopback without a preflight),
    and every query runs read-only (:data:`READ_ONLY_SETTINGS`) on a connection of its own,
    so a heavy query never holds the worker's inserts.
    """

    def __init__(self, store: Store, port_dir: Path) -> None:
        self._store = store
        self._port_file = port_dir / PORT_FILE
        self._token_file = port_dir / TOKEN_FILE
        self._token = secrets.token_hex(32)
        reader = _ReadConnection(store.path)
        self._reader = reader
        token = self._token

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                refused = _refusal(self.headers, token)
                if refused:
                    self._answer(403, {"error": refused})
                    return
                sql = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode(
                    "utf-8", "replace")
                try:
                    cols, rows = reader.query(sql)
                    self._answer(200, {"columns": cols,
                                       "rows": [[_jsonable(v) for v in r] for r in rows]})
                except Exception as exc:  # report any SQL error to the caller, keep serving
                    self._answer(400, {"error": str(exc)})

            def _answer(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the serving loop to look at its flag, at most this often:
        # the default 0.5 s was most of the time a drained crawl spent stopping its store.
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": SHUTDOWN_POLL_S},
                                        name="store-query-server")

    def start(self) -> None:
        self._thread.start()
        _write_private(self._token_file, self._token)
        tmp = self._port_file.with_suffix(".tmp")  # readers never see a half-written port
        tmp.write_text(str(self._server.server_address[1]))
        tmp.replace(self._port_file)

    def stop(self) -> None:
        self._port_file.unlink(missing_ok=True)
        self._token_file.unlink(missing_ok=True)
        self._server.shutdown()
        self._server.server_close()
        self._reader.close()


def _refusal(headers: Any, token: str) -> str:
    """Why a request to the query endpoint is refused ("" if it is not)."""
    if headers.get("Origin") is not None:
        return "browser requests are refused (a request carrying an Origin header)"
    given = headers.get(TOKEN_HEADER) or ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        return f"no valid {TOKEN_HEADER}: read it from {TOKEN_FILE} beside the store"
    return ""


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable and writable by this user only, replaced whole."""
    tmp = path.with_suffix(".tmp-token")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


class _ReadConnection:
    """The query server's own connection to the engine the store worker has open: readers'
    queries wait for each other, never for the worker's inserts (chDB runs one engine per
    process; each connection runs its queries on its own)."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._client = clickhouse_connect.get_client(interface="chdb", path=str(path),
                                                     chdb_options=CHDB_OPTIONS)

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._lock:
            result = self._client.query(sql, settings=READ_ONLY_SETTINGS)
        return list(result.column_names), [tuple(r) for r in result.result_rows]

    def close(self) -> None:
        with self._lock:
            self._client.close()


def run_query(settings: Settings, sql: str, *, wait_s: float = READER_WAIT_S,
              on_wait: Callable[[str], None] | None = None
              ) -> tuple[list[str], list[list[Any]]]:
    """Run a query against the crawl's store, through its owner process if one lives.

    While a store worker owns the embedded store, the query goes to its endpoint; if it
    does not serve yet (starting), this waits up to ``wait_s`` for it, saying so once
    through ``on_wait`` (default: a warning on stderr). With no owner alive the path is
    opened here, under the store's open lock, for this query only.

    An engine error is a :class:`QueryError` with the engine's first line, never a trace;
    a store still held after ``wait_s`` is a :class:`StoreHeldError` naming the holder."""
    try:
        return _run_query(settings, sql, wait_s, on_wait or _warn)
    except ClickHouseError as exc:
        raise QueryError(engine_message(str(exc))) from exc


def _warn(text: str) -> None:
    log.warning("%s", text)


def engine_message(text: str) -> str:
    """The engine's reason without its code prefix and echo of the query (one line)."""
    line = text.strip().splitlines()[0] if text.strip() else "query failed"
    line = re.sub(r"^.*?DB::Exception: ", "", line)
    return re.sub(r"\s*In scope .*?(\([A-Z_]+\))?$", r" \1", line).strip()


def _run_query(settings: Settings, sql: str, wait_s: float,
               on_wait: Callable[[str], None]) -> tuple[list[str], list[list[Any]]]:
    if settings.clickhouse_dsn.get():
        return _local_query(Store(settings), sql)
    path = settings.clickhouse_path
    if not path.exists():
        raise ConfigError(f"no crawl store at {path.resolve()} (the data dir is relative to "
                          "where you run the command): run a crawl first, run from the "
                          "crawl's directory, or point at its store with --data-dir "
                          "(CRAWLFLEET_DATA_DIR) or --clickhouse")
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        port = _port(path)
        if port is not None:
            try:
                return _remote_query(port, sql, _token(path))
            except _OwnerGone:
                pass  # a stale port file, or a worker that just died: the locks decide
        try:
            store = Store(settings)
        except StoreHeldError as exc:
            if time.monotonic() >= deadline:
                raise StoreHeldError(f"{exc}, which did not serve queries within "
                                     f"{wait_s:g} s (see `crawlfleet doctor`)",
                                     exc.holder, exc.by_owner) from None
            if not told:
                told = True
                on_wait(f"{exc}; waiting up to {wait_s:g} s for it to "
                        + ("serve queries" if exc.by_owner else "finish"))
            time.sleep(0.2)
            continue
        return _local_query(store, sql)


def _local_query(store: Store, sql: str) -> tuple[list[str], list[list[Any]]]:
    try:
        cols, rows = store.read_only_query(sql)
        return cols, [[_jsonable(v) for v in r] for r in rows]
    finally:
        store.close()


def _port(path: Path) -> int | None:
    try:
        return int((path / PORT_FILE).read_text())
    except (OSError, ValueError):
        return None


class _OwnerGone(RetryableError):
    """Nobody answers on the port file's port (stale), or the answer broke off (the owner
    died mid-query): internal to :func:`_run_query`, which then consults the locks."""


def query_owner(path: Path, sql: str) -> tuple[list[str], list[list[Any]]]:
    """``sql`` through the live store worker of the store at ``path`` only, never opening
    the engine here; a :class:`CrawlfleetError` when none serves (probes, tests)."""
    port = _port(path)
    if port is None:
        raise InfraError(f"no store worker serves the store at {path}")
    return _remote_query(port, sql, _token(path))


def _token(path: Path) -> str:
    try:
        return (path / TOKEN_FILE).read_text().strip()
    except OSError:
        return ""  # a worker that is starting or gone: its answer says which


def _remote_query(port: int, sql: str, token: str) -> tuple[list[str], list[list[Any]]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=sql.encode(), method="POST",
                                 headers={TOKEN_HEADER: token})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback only
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        payload = json.loads(exc.read())
        if exc.code == 403:
            raise InfraError(f"the store worker on port {port} refused the query: "
                             f"{payload.get('error')}") from exc
        raise QueryError(engine_message(str(payload.get("error")))) from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionError):
            raise _OwnerGone(str(exc)) from exc
        raise InfraError(f"the store worker on port {port} did not answer: {exc}") from exc
    except (ConnectionError, http.client.HTTPException) as exc:
        raise _OwnerGone(str(exc)) from exc
    except TimeoutError as exc:
        raise InfraError(f"the store worker on port {port} did not answer within 60 s") \
            from exc
    return payload["columns"], payload["rows"]
