"""``crawlfleet crawls``: the crawls a broker holds, and ``crawls rm`` to remove one's topics
and groups (:mod:`crawlfleet.crawls`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from typer.core import TyperGroup

from core.errors import CrawlfleetError
from crawlfleet.cli_base import (
    BootstrapOpt,
    ConfigOpt,
    DataDirOpt,
    _Command,
    _fail,
    _settings,
    app,
    cell,
    console,
)

crawls_app = typer.Typer(
    help="The crawls on the broker (running, interrupted, finished): `crawlfleet crawls` "
    "lists them, `crawlfleet crawls rm NAME` removes one's topics and groups.",
    invoke_without_command=True, no_args_is_help=False, pretty_exceptions_enable=False,
    rich_markup_mode=None, cls=TyperGroup)
app.add_typer(crawls_app, name="crawls")


@crawls_app.callback()
def crawls_list(ctx: typer.Context, config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
                data_dir: DataDirOpt = None) -> None:
    """List the crawls on the broker: name (its --topic-prefix), start, pages, state."""
    if ctx.invoked_subcommand is not None:
        return
    from crawlfleet.crawls import COLUMNS, list_crawls
    from crawlfleet.reach import reach_kafka
    try:
        crawls = list_crawls(reach_kafka(_settings(config, bootstrap=bootstrap,
                                                   data_dir=data_dir)))
    except CrawlfleetError as exc:
        _fail(exc)
        return
    if not crawls:
        console.print("0 crawls on the broker", markup=False)
        return
    t = Table(*COLUMNS)
    for c in crawls:
        t.add_row(*(cell(v) for v in c.row()))
    console.print(t)
    console.print(f"{len(crawls)} crawls; act on one with --topic-prefix NAME, remove one "
                  "with `crawlfleet crawls rm NAME`", markup=False, highlight=False)


@crawls_app.command("rm", cls=_Command)
def crawls_rm(name: Annotated[str, typer.Argument(
                  metavar="NAME", help="The crawl's name (its topic prefix).")],
              config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
              data_dir: DataDirOpt = None) -> None:
    """Delete a crawl's topics and consumer groups (its pages stay in the store)."""
    from crawlfleet.crawls import normal_prefix, remove_crawl
    from crawlfleet.reach import reach_kafka
    try:
        s = reach_kafka(_settings(config, bootstrap=bootstrap, data_dir=data_dir))
        topics, groups = remove_crawl(s, name)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    console.print(f"removed crawl {normal_prefix(name)}: {topics} topics, {groups} groups",
                  markup=False, highlight=False)
