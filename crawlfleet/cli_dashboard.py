"""``crawlfleet dashboard``: the store's views in a browser (:mod:`crawlfleet.dashboard`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from core.errors import CrawlfleetError
from crawlfleet.cli_base import (
    BootstrapOpt,
    ClickhouseOpt,
    ConfigOpt,
    DataDirOpt,
    PrefixOpt,
    _fail,
    _settings,
    command,
    setting_help,
)


@command("dashboard")
def dashboard_cmd(port: Annotated[int | None, typer.Option(
                      help=setting_help("Port on 127.0.0.1 (0 = any free port).",
                                        "dashboard_port"))] = None,
                  refresh: Annotated[float, typer.Option(
                      min=0.5, help="Seconds between the page's refreshes.")] = 5.0,
                  approvals: Annotated[bool, typer.Option(
                      help="Read the approved version tuples from crawl.control, to mark "
                      "unapproved ones (needs Kafka).")] = True,
                  config: ConfigOpt = None, clickhouse: ClickhouseOpt = None,
                  data_dir: DataDirOpt = None, bootstrap: BootstrapOpt = None,
                  topic_prefix: PrefixOpt = None) -> None:
    """Serve the dashboard on 127.0.0.1 for the crawl store (while a crawl runs or after);
    prints its URL with a one-time token. From another machine: an SSH tunnel."""
    from crawlfleet.dashboard.approvals import from_control
    from crawlfleet.dashboard.server import Dashboard, serve, store_query
    try:
        s = _settings(config, clickhouse=clickhouse, data_dir=data_dir, bootstrap=bootstrap,
                      topic_prefix=topic_prefix,
                      **({"dashboard_port": port} if port is not None else {}))
        dash = Dashboard(store_query(s), approved=from_control(s) if approvals else None,
                         refresh_s=refresh)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(dash, s.dashboard_port, _announce(s.clickhouse_path)))
    except CrawlfleetError as exc:
        _fail(exc)


def _announce(store: Path) -> Callable[[str], None]:
    def ready(url: str) -> None:
        # Plain print, flushed: scripts and tests read the URL from the first line.
        print(f"dashboard: {url}", flush=True)
        print(f"store: {store} (Ctrl-C stops the dashboard; from another machine: "
              "ssh -L PORT:127.0.0.1:PORT this-host, then open the same URL)",
              file=sys.stderr, flush=True)
    return ready
