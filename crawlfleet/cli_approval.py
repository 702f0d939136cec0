"""Operator commands for the approved set of version tuples: ``approve``, ``approved``,
``revoke`` (through ``crawl.control``; workers enforce it: :mod:`streams.approval`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from core.errors import CrawlfleetError
from crawlfleet.cli_base import (
    BootstrapOpt,
    ConfigOpt,
    CrawlOpt,
    DataDirOpt,
    _error,
    _fail,
    command,
    console,
    crawl_settings,
)

TupleArg = Annotated[str, typer.Argument(
    metavar="TUPLE", help="A version tuple: bundle=B;http=H;tls=T;code=C (quote it).")]


def _tuple(text: str) -> Any:
    from core.versions import VersionTuple
    try:
        return VersionTuple.parse(text)
    except CrawlfleetError as exc:
        _error(str(exc))
        raise typer.Exit(2) from None


@command("approve")
def approve_cmd(versions: Annotated[list[str] | None, typer.Argument(
                    metavar="TUPLE", show_default=False,
                    help="Version tuples: bundle=B;http=H;tls=T;code=C "
                    "(quote each).")] = None,
                current: Annotated[bool, typer.Option(
                    "--current", help="Also approve the tuple this install runs as (its "
                    "configuration, libraries and code revision). [default: off]")] = False,
                config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
                topic_prefix: CrawlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Add version tuples to the fleet's approved set, in one write (through crawl.control).
    Once the set is non-empty, only workers running as an approved tuple consume."""
    from core.versions import worker_tuple
    from producers import control
    chosen = [_tuple(v) for v in versions or []]
    if not chosen and not current:
        _error("name a TUPLE or pass --current")
        raise typer.Exit(2)
    try:
        s = crawl_settings(config, bootstrap, topic_prefix, data_dir)
        if current:
            chosen.append(worker_tuple(s))
        control.approve(s, chosen)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    for v in chosen:
        console.print(f"approved {v}", markup=False, highlight=False)


@command("approved")
def approved_cmd(config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
                 topic_prefix: CrawlOpt = None, data_dir: DataDirOpt = None) -> None:
    """List the fleet's approved version tuples (empty: no enforcement)."""
    from core.versions import worker_tuple
    from producers import control
    try:
        s = crawl_settings(config, bootstrap, topic_prefix, data_dir)
        approved = control.approved(s)
        mine = str(worker_tuple(s))
    except CrawlfleetError as exc:
        _fail(exc)
        return
    if not approved:
        console.print("empty: no enforcement (every worker consumes)", markup=False)
    for text in sorted(approved):
        console.print(text + ("   (this install)" if text == mine else ""), markup=False,
                      highlight=False)


@command("revoke")
def revoke_cmd(version: TupleArg, config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
               topic_prefix: CrawlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Take a version tuple out of the approved set: its running workers leave their groups
    within seconds (revoking the last one empties the set: no enforcement)."""
    from producers import control
    chosen = _tuple(version)
    try:
        s = crawl_settings(config, bootstrap, topic_prefix, data_dir)
        control.revoke(s, chosen)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    console.print(f"revoked {chosen}", markup=False, highlight=False)
