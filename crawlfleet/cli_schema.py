"""``crawlfleet schema``: the store's DDL printed, or a ClickHouse cluster's applied once.

A cluster's schema is a deploy step (``--apply``, a Job run before the store workers and again
after an upgrade that adds a column), never something each store worker does on start.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from core.errors import ConfigError, CrawlfleetError
from crawlfleet.cli_base import (
    ClickhouseOpt,
    ConfigOpt,
    _fail,
    _settings,
    command,
    console,
    setting_help,
)
from infra.cluster_durability import DEFAULT_STORE_WORKERS


@command("schema")
def schema_cmd(cluster: Annotated[str | None, typer.Option(
                   help=setting_help("The schema of this ClickHouse cluster (ON CLUSTER, "
                                     "Replicated*MergeTree, Distributed tables, every name "
                                     "in the DSN's database).",
                                     "clickhouse_cluster", "none: one server's schema"))
               ] = None,
               apply: Annotated[bool, typer.Option(
                   "--apply", help="Run it on the cluster (once, as a deploy job; safe to "
                   "run again) instead of printing it. Store workers never run it: they "
                   "wait until it is there. [default: print]")] = False,
               database: Annotated[str | None, typer.Option(
                   help="The database to print the schema for. [default: the DSN's, "
                   "else default]")] = None,
               store_workers: Annotated[int, typer.Option(
                   help="Store workers the replicated deduplication window is sized for "
                   "(blocks per table grow with them).")] = DEFAULT_STORE_WORKERS,
               config: ConfigOpt = None, clickhouse: ClickhouseOpt = None) -> None:
    """Print the store's DDL (from infra/sql), or apply a cluster's once with --apply."""
    from infra import cluster_apply
    from infra.cluster_durability import dedup_window
    from infra.cluster_schema import database_of, render, render_embedded
    try:
        s = _settings(config, clickhouse=clickhouse)
        name = cluster or s.clickhouse_cluster
        if apply:
            if not name:
                raise ConfigError("--apply is for a cluster (--cluster NAME): a single "
                                  "server's store worker makes its own schema")
            if database is not None:
                raise ConfigError("--apply uses the DSN's database (--clickhouse "
                                  "http://.../DB): drop --database")

            def said(i: int, n: int, stmt: str) -> None:
                console.print(f"[{i}/{n}] {stmt.splitlines()[0][:110]}", markup=False)

            n = cluster_apply.apply_schema(s, name, store_workers=store_workers, said=said)
            console.print(f"applied {n} statements on cluster {name}, database "
                          f"{database_of(s.clickhouse_dsn.get())}", markup=False)
            return
        if not name:
            sys.stdout.write(render_embedded())
            return
        db = database or database_of(s.clickhouse_dsn.get())
        sys.stdout.write(render(name, db, dedup_window(s, store_workers)))
    except (CrawlfleetError, ValueError) as exc:
        _fail(exc if isinstance(exc, CrawlfleetError) else ConfigError(str(exc)))
