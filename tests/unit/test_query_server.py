"""The embedded store's query endpoint is not an open door: a token only the owner's user can
read, no browser requests, read-only queries (no DDL, no writes, no table functions that reach
out), and a connection of its own so a slow query never holds the worker's inserts."""

from __future__ import annotations

import json
import stat
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from core.config import Settings
from core.errors import CrawlfleetError
from infra.clickhouse import PORT_FILE, TOKEN_FILE, TOKEN_HEADER, Store, StoreOwnership
from infra.store_query import QueryServer, query_owner, run_query


@pytest.fixture
def served(embedded_settings: Settings) -> Iterator[tuple[Settings, Store]]:
    s = embedded_settings
    ownership = StoreOwnership(s)
    assert ownership.claim()
    store = Store(s, owner=True)
    store.ensure_schema()
    server = QueryServer(store, s.clickhouse_path)
    server.start()
    try:
        yield s, store
    finally:
        server.stop()
        store.close()
        ownership.release()


def _post(s: Settings, sql: str, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    port = int((s.clickhouse_path / PORT_FILE).read_text())
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=sql.encode(),
                                 method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _token(s: Settings) -> str:
    return (s.clickhouse_path / TOKEN_FILE).read_text()


def test_the_token_file_is_the_owners_alone(served: tuple[Settings, Store]) -> None:
    s, _ = served
    mode = stat.S_IMODE((s.clickhouse_path / TOKEN_FILE).stat().st_mode)
    assert mode == 0o600
    assert len(_token(s)) >= 32


def test_a_request_without_the_token_is_refused(served: tuple[Settings, Store]) -> None:
    s, _ = served
    assert _post(s, "SELECT 1", {})[0] == 403
    assert _post(s, "SELECT 1", {TOKEN_HEADER: "0" * 64})[0] == 403
    code, body = _post(s, "SELECT 1", {TOKEN_HEADER: _token(s)})
    assert code == 200 and body["rows"] == [[1]]


def test_a_browser_request_is_refused_even_with_the_token(
        served: tuple[Settings, Store]) -> None:
    s, _ = served
    code, body = _post(s, "SELECT 1", {TOKEN_HEADER: _token(s), "Origin": "http://evil.test",
                                       "Content-Type": "text/plain"})
    assert code == 403 and "Origin" in str(body["error"])


@pytest.mark.parametrize("sql", [
    "DROP TABLE pages",
    "INSERT INTO queue_samples (stage) VALUES ('x')",
    "SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'a String')",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM remote('127.0.0.1:1', system.one)",
    "SELECT 1 SETTINGS readonly = 0",
])
def test_queries_run_read_only(served: tuple[Settings, Store], sql: str) -> None:
    s, store = served
    code, body = _post(s, sql, {TOKEN_HEADER: _token(s)})
    assert code == 400 and "READONLY" in str(body["error"]), body
    assert store.scalar("SELECT count() FROM system.tables WHERE name = 'pages'") == 1
    # The refusal is the reader's alone: the worker's own connection still writes.
    store.insert("queue_samples", ("ts", "stage", "topic"), [(datetime.now(UTC), "f", "t")],
                 f"after {sql}")
    assert store.scalar("SELECT count() FROM queue_samples") == 1


def test_the_cli_path_sends_the_token_and_is_read_only_too(
        served: tuple[Settings, Store]) -> None:
    s, _ = served
    assert run_query(s, "SELECT 41 + 1")[1] == [[42]]
    with pytest.raises(CrawlfleetError, match=r"READONLY|readonly"):
        run_query(s, "DROP TABLE pages")
    assert query_owner(s.clickhouse_path, "SELECT count() FROM pages")[1] == [[0]]


def test_readers_run_under_the_stores_limits_which_a_query_cannot_lift(
        served: tuple[Settings, Store]) -> None:
    """Time and memory limits beside readonly (issue 40), on every query of a reader's
    session, refused ones between them; a query's SETTINGS clause cannot raise them."""
    from infra.clickhouse import READ_ONLY_SETTINGS
    s, _ = served
    assert list(READ_ONLY_SETTINGS)[-1] == "readonly"  # limits first: see its comment
    assert READ_ONLY_SETTINGS["max_execution_time"] > 0 < READ_ONLY_SETTINGS["max_memory_usage"]
    for _ in range(2):
        with pytest.raises(CrawlfleetError, match=r"READONLY|readonly"):
            query_owner(s.clickhouse_path, "SELECT 1 SETTINGS max_execution_time = 0")
        with pytest.raises(CrawlfleetError, match=r"READONLY|readonly"):
            query_owner(s.clickhouse_path, "INSERT INTO pages (url) VALUES ('x')")
        assert query_owner(s.clickhouse_path, "SELECT 7")[1] == [[7]]


def test_a_slow_query_never_holds_the_workers_inserts(served: tuple[Settings, Store]) -> None:
    """A reader's query that holds the engine 3 s (``sleep(3)``): the worker's insert, made
    half a second in, returns long before the query could have let a shared lock go."""
    s, store = served
    sent = threading.Event()

    def slow() -> None:
        sent.set()
        query_owner(s.clickhouse_path, "SELECT sleep(3)")

    reader = threading.Thread(target=slow)
    began = time.monotonic()
    reader.start()
    try:
        sent.wait(10)
        time.sleep(0.5)  # the query is under way
        store.insert("queue_samples", ("ts", "stage", "topic"),
                     [(datetime.now(UTC), "fetch", "t")], "t1")
        inserted_after = time.monotonic() - began
    finally:
        reader.join()
    query_took = time.monotonic() - began
    print(f"insert returned after {inserted_after:.2f} s; the query after {query_took:.2f} s")
    assert query_took >= 3.0
    assert inserted_after < 2.5, "the insert waited for the reader's query"
    assert store.scalar("SELECT count() FROM queue_samples") == 1


def test_no_owner_the_reader_opens_the_store_read_only(embedded_settings: Settings) -> None:
    s = embedded_settings
    store = Store(s)
    store.ensure_schema()
    store.close()
    with pytest.raises(CrawlfleetError, match=r"READONLY|readonly"):
        run_query(s, "DROP TABLE pages")
    assert run_query(s, "SELECT count() FROM system.tables WHERE name = 'pages'")[1] == [[1]]
