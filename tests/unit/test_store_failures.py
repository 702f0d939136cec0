"""A ClickHouse server's failures are classified by type and code, once: "wait and try
again" (a replica down, a quorum not met, unreachable, the schema not applied yet) apart from
a failure no retry cures, which surfaces as it is."""

from __future__ import annotations

from clickhouse_connect.driver.exceptions import (
    DatabaseError,
    OperationalError,
    ProgrammingError,
)

from core.errors import RetryableError
from infra.clickhouse_errors import SchemaMissingError, StoreUnavailableError, classify


def test_a_replica_down_or_a_quorum_not_met_is_waited_for() -> None:
    for code in (285, 286, 319, 159, 242, 999, 210, 279):  # TOO_FEW_LIVE_REPLICAS ...
        got = classify(DatabaseError("x", code=code), "ch:8123")
        assert isinstance(got, StoreUnavailableError) and got.retryable, code
        assert not isinstance(got, SchemaMissingError)
        assert "ch:8123" in str(got)


def test_an_unreachable_or_silent_server_is_waited_for() -> None:
    got = classify(OperationalError("Error executing HTTP request"), "ch:8123")
    assert isinstance(got, StoreUnavailableError)
    # an error without an engine code did not come from ClickHouse (a proxy's 502)
    assert isinstance(classify(DatabaseError("HTTP 502"), "ch"), StoreUnavailableError)


def test_a_missing_table_column_or_database_is_the_schema_not_applied_yet() -> None:
    for code in (60, 81, 16):
        got = classify(DatabaseError("x", code=code), "ch")
        assert isinstance(got, SchemaMissingError) and isinstance(got, RetryableError)


def test_a_bug_is_not_waited_for() -> None:
    assert classify(DatabaseError("syntax", code=62), "ch") is None  # SYNTAX_ERROR
    assert classify(DatabaseError("type", code=53), "ch") is None  # TYPE_MISMATCH
    assert classify(ProgrammingError("closed"), "ch") is None
    assert classify(ValueError("not ClickHouse's"), "ch") is None
