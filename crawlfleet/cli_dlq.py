"""``crawlfleet dlq list | show | replay``: the dead letters of the crawl you mean.

Every crawl of a data dir writes one store, so each command picks its crawl as the other
operator commands do (``--topic-prefix``/``--crawl NAME``, else the configured prefix, else
the crawl running on the data dir, else the shared fleet) and acts on that crawl's dead
letters only (:mod:`crawlfleet.dlq`). ``list`` and ``show`` read the store alone: a crawl
that ended has no topics left, its dead letters stay. ``replay`` publishes to the crawl's
frontier, so its topics must exist (the same error at once as ``pause`` gives)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from core.config import Settings
from core.errors import CrawlfleetError
from crawlfleet.cli_base import (
    BootstrapOpt,
    ClickhouseOpt,
    ConfigOpt,
    CrawlOpt,
    DataDirOpt,
    TargetOpt,
    _Command,
    _error,
    _fail,
    _on_cluster,
    cell,
    console,
    crawl_name,
    crawl_settings,
    dlq_app,
    err_console,
    store_crawl_settings,
)

ReasonOpt = Annotated[str | None, typer.Option(
    "--reason", help="Only this reason class. [default: every reason]")]
SinceOpt = Annotated[str | None, typer.Option(
    "--since", help="Only dead letters of the last DURATION (90s, 15m, 2h, 1d). "
    "[default: all time]")]


def _filters(s: Settings, reason: str | None, target: str | None, since: str | None) -> Any:
    """The selection, on the crawl ``s`` names."""
    from crawlfleet import dlq
    return dlq.Filters(reason, target, dlq.parse_duration(since) if since else None,
                       crawl=s.topic_prefix)


def _say_elsewhere(s: Settings, filters: Any) -> None:
    """After an empty selection: the crawls of the store that hold such dead letters, so an
    operator who meant another crawl sees which (a one-off crawl's, once it ended, are
    found by name only: nothing runs on the data dir any more)."""
    from crawlfleet import dlq
    others = {c: n for c, n in dlq.dead_by_crawl(s, filters).items() if c != s.topic_prefix}
    if others:
        err_console.print(
            "dead letters of other crawls in this store: "
            + ", ".join(f"{dlq.crawl_phrase(c)} ({n})" for c, n in others.items())
            + "; pick one with --crawl NAME", markup=False, highlight=False)


@dlq_app.command("list", cls=_Command)
def dlq_list(reason: ReasonOpt = None, target: TargetOpt = None, since: SinceOpt = None,
             limit: Annotated[int, typer.Option(help="At most this many (0: all).")] = 200,
             config: ConfigOpt = None, topic_prefix: CrawlOpt = None,
             clickhouse: ClickhouseOpt = None, data_dir: DataDirOpt = None) -> None:
    """The crawl's dead letters, oldest first, with the id `dlq show` takes."""
    from crawlfleet import dlq
    try:
        s = store_crawl_settings(config, topic_prefix, clickhouse, data_dir)
        filters = _filters(s, reason, target, since)
        cols, rows = dlq.list_dead(s, filters, limit or None)
        if not rows:
            console.print(f"0 rows: no dead letters of {crawl_name(s)}", markup=False,
                          highlight=False)
            _say_elsewhere(s, filters)
            return
    except CrawlfleetError as exc:
        _fail(exc)
        return
    t = Table(*cols, title=f"dead letters of {crawl_name(s)}")
    for r in rows:
        t.add_row(*(cell(v) for v in r))
    console.print(t)


@dlq_app.command("show", cls=_Command)
def dlq_show(event_id: Annotated[str, typer.Argument(metavar="ID", help="Id from `dlq list`.")],
             config: ConfigOpt = None, topic_prefix: CrawlOpt = None,
             clickhouse: ClickhouseOpt = None, data_dir: DataDirOpt = None) -> None:
    """One dead letter of the crawl, whole: its job, full error, attempts, worker and version
    tuple (another crawl's id is refused, naming its crawl)."""
    import json as _json

    from crawlfleet import dlq
    try:
        s = store_crawl_settings(config, topic_prefix, clickhouse, data_dir)
        record = dlq.show(s, event_id, s.topic_prefix)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    console.print_json(_json.dumps(record, default=str))


@dlq_app.command("replay", cls=_Command)
def dlq_replay(reason: ReasonOpt = None, target: TargetOpt = None, since: SinceOpt = None,
               dry_run: Annotated[bool, typer.Option(
                   "--dry-run", help="Show what would go; needs no broker. [default: off]")
               ] = False,
               all_: Annotated[bool, typer.Option(
                   "--all", help="With no --reason, --target or --since: replay every dead "
                   "letter of the crawl that can succeed. [default: off]")] = False,
               config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
               topic_prefix: CrawlOpt = None, clickhouse: ClickhouseOpt = None,
               data_dir: DataDirOpt = None) -> None:
    """Put the crawl's selected dead jobs back on its frontier: fresh attempts, a replay mark,
    the normal robots, cap, scope and dedupe path; no other crawl's dead letter is sent.
    Replaying the same selection again is a no-op. robots_disallowed and
    address_not_allowed are replayed only when --reason names them (nothing but a change of
    the site or the settings can cure them)."""
    from crawlfleet import dlq
    given = (reason, target, since)
    try:
        if not any(given) and not all_:
            _error("no filter: this would replay every dead letter of the crawl; name "
                   "--reason, --target or --since, or pass --all")
            raise typer.Exit(2)
        s = store_crawl_settings(config, topic_prefix, clickhouse, data_dir) if dry_run \
            else _on_cluster(crawl_settings(config, bootstrap, topic_prefix, data_dir,
                                            clickhouse=clickhouse))
        filters = _filters(s, *given)
        plan, report = dlq.replay(s, filters, dry_run)
        for job, dead_id in zip(plan.jobs, plan.ids, strict=True):
            console.print(f"{'would replay' if dry_run else 'replayed'} {dead_id} "
                          f"{job['url']}", markup=False, highlight=False)
        console.print(f"{len(plan.jobs)} {'to replay' if dry_run else 'replayed'} in "
                      f"{crawl_name(s)}, {plan.superseded} older dead letters of the same "
                      f"pages, {plan.unreplayable} without a job (undecodable records)",
                      markup=False, highlight=False)
        if not plan.jobs:
            _say_elsewhere(s, filters)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    if report is not None and report.waited_s:
        console.print(f"waited {report.waited_s:.1f}s on the frontier bound")
