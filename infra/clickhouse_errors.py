"""A ClickHouse server's failures, classified once by their type and error code.

The store worker must tell "wait and try again" (a replica down, a quorum not met, the
server unreachable or slow, the schema not applied yet) from a failure no retry can cure (a
bug: a syntax error, a type mismatch). clickhouse-connect raises ``OperationalError`` for
transport failures and ``DatabaseError`` carrying the server's numeric ``code`` (the
``X-ClickHouse-Exception-Code`` header) for the engine's; codes name the failure, so no
message text is read here.
"""

from __future__ import annotations

from clickhouse_connect.driver.exceptions import (
    ClickHouseError,
    DatabaseError,
    OperationalError,
)

from core.errors import CrawlfleetError, RetryableError


class StoreUnavailableError(RetryableError):
    """The ClickHouse server cannot take the store's work now: it is unreachable or slow, a
    replica is down, an insert's quorum was not met. Its batch's offsets stay uncommitted
    (Kafka keeps the records) and the store worker waits and tries again."""

    reason = "store_unavailable"


class SchemaMissingError(StoreUnavailableError):
    """The cluster schema (or part of it) is not on the server yet: it is applied once by
    ``crawlfleet schema --cluster NAME --apply``, and the store worker waits for it."""

    reason = "schema_missing"


#: Server error codes that another try, later, may not meet (ClickHouse's ErrorCodes.cpp).
TRANSIENT_CODES = frozenset({
    3,    # UNEXPECTED_END_OF_FILE: a connection cut mid-answer
    159,  # TIMEOUT_EXCEEDED: distributed DDL or a query past its timeout
    164,  # READONLY: a replica in read-only mode (lost its Keeper session)
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR: a shard of the Distributed insert unreachable
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY: the replica has no Keeper session
    252,  # TOO_MANY_PARTS: inserts faster than merges; back off
    279,  # ALL_CONNECTION_TRIES_FAILED: every replica of a shard unreachable
    285,  # TOO_FEW_LIVE_REPLICAS: the insert quorum cannot be met now
    286,  # UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE
    319,  # UNKNOWN_STATUS_OF_INSERT: the quorum wait timed out; a retry deduplicates
    425,  # SYSTEM_ERROR
    999,  # KEEPER_EXCEPTION
})
#: Codes that mean the schema is not (all) there: the schema job has not run (or not since
#: a column was added).
SCHEMA_CODES = frozenset({
    16,   # NO_SUCH_COLUMN_IN_TABLE
    60,   # UNKNOWN_TABLE
    81,   # UNKNOWN_DATABASE
})


def classify(exc: BaseException, where: str) -> CrawlfleetError | None:
    """The crawlfleet error for a ClickHouse client's ``exc`` (None: not one to wait for,
    let it surface as it is). ``where`` names the server for the message (no credentials)."""
    if not isinstance(exc, ClickHouseError):
        return None
    code = getattr(exc, "code", None)
    detail = f"{type(exc).__name__}: {exc}"[:300]
    if code in SCHEMA_CODES:
        return SchemaMissingError(f"ClickHouse at {where}: {detail}")
    if code in TRANSIENT_CODES:
        return StoreUnavailableError(f"ClickHouse at {where} cannot take it now: {detail}")
    if code is None and (isinstance(exc, OperationalError) or type(exc) is DatabaseError):
        # No engine code: ClickHouse did not answer (the connection failed or timed out,
        # or a proxy in front of it answered an error of its own). The driver's own
        # refusals (ProgrammingError, DataError ...) are bugs, not outages.
        return StoreUnavailableError(f"ClickHouse at {where} unreachable: {detail}")
    return None
