"""Apply the cluster schema once: ``crawlfleet schema --cluster NAME --apply`` (a deploy job).

Every statement is idempotent (``IF NOT EXISTS``, ``ADD COLUMN IF NOT EXISTS``, ``OR REPLACE``),
so the job is safe to run again: after an upgrade that adds a column, or after a run that a
host down stopped. Each ON CLUSTER statement waits for every host up to the server's
``distributed_ddl_task_timeout`` and then fails (``distributed_ddl_output_mode = 'throw'``):
the job stops at the first such statement and says which, so an operator re-runs it once the
host is back; store workers meanwhile wait (``store_waiting``) for the schema to be complete.

The connection uses the server's ``default`` database: the DSN's database may not exist
yet (its ``CREATE DATABASE`` is the first statement), and every name in the schema is
qualified with it anyway.
"""

from __future__ import annotations

from collections.abc import Callable

import clickhouse_connect

from core.config import Settings
from core.errors import ConfigError, InfraError
from infra.clickhouse_errors import classify
from infra.cluster_durability import DEFAULT_STORE_WORKERS, dedup_window
from infra.cluster_schema import cluster_statements, database_of

#: How long the server waits for every host of one ON CLUSTER statement (its default, said
#: explicitly), and how long the client waits for its answer (a little more).
DDL_TASK_TIMEOUT_S = 180
_CLIENT_TIMEOUT_S = DDL_TASK_TIMEOUT_S + 30


def schema_for(settings: Settings, cluster: str,
               store_workers: int = DEFAULT_STORE_WORKERS) -> list[str]:
    """The statements for ``cluster`` in the DSN's database, windows from ``settings``."""
    return cluster_statements(cluster, database_of(settings.clickhouse_dsn.get()),
                              window=dedup_window(settings, store_workers))


def apply_schema(settings: Settings, cluster: str, *,
                 store_workers: int = DEFAULT_STORE_WORKERS,
                 said: Callable[[int, int, str], None] | None = None) -> int:
    """Run the cluster schema on the DSN's server; the number of statements run.

    ``said(i, n, statement)`` is told before each one. Raises a RetryableError (a host down,
    a DDL timeout: run it again later) or InfraError (refused: fix and run again)."""
    dsn = settings.clickhouse_dsn.get()
    if not dsn:
        raise ConfigError("crawlfleet schema --apply needs a ClickHouse server "
                          "(--clickhouse or CRAWLFLEET_CLICKHOUSE_DSN)")
    stmts = schema_for(settings, cluster, store_workers)
    try:
        client = clickhouse_connect.get_client(
            dsn=dsn, database="default", connect_timeout=settings.clickhouse_timeout_s,
            send_receive_timeout=_CLIENT_TIMEOUT_S,
            settings={"distributed_ddl_task_timeout": DDL_TASK_TIMEOUT_S,
                      "distributed_ddl_output_mode": "throw"})
    except Exception as exc:  # the driver raises many types: one clear error
        raise _failure(exc, "connecting") from exc
    try:
        for i, stmt in enumerate(stmts, 1):
            if said is not None:
                said(i, len(stmts), stmt)
            try:
                client.command(stmt)
            except Exception as exc:
                raise _failure(exc, f"statement {i} of {len(stmts)}: {_head(stmt)}") from exc
    finally:
        client.close()
    return len(stmts)


def _head(stmt: str) -> str:
    return stmt.split("(", 1)[0].split(" AS ", 1)[0].strip()[:120]


def _failure(exc: Exception, what: str) -> Exception:
    known = classify(exc, "the configured DSN")
    if known is not None:
        return type(known)(f"{what}: {known}; the schema is idempotent: run it again")
    return InfraError(f"{what}: {type(exc).__name__}: {exc}"[:600])
