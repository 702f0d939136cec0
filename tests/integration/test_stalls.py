"""A stage with lag and nobody serving it is shown as stalled within seconds, with why --
by ``crawl``'s progress and by ``crawlfleet top`` (real broker, real workers, real chDB)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    report,
    slow_sql,
    stage_lags,
    wait_drained,
    wait_until,
)
from rich.console import Console

from core.config import Settings
from crawlfleet.crawl import Fleet, _watch, settings_env
from sites.behaviour_site import Behaviour, BehaviourSite

pytestmark = pytest.mark.integration

HOST = "127.0.0.2"
#: A reader that holds the store for 24 s.
SLOW_SQL = slow_sql(24)


def cli(settings: Settings, *args: str, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings), "COLUMNS": "300"}
    env.pop("CRAWLFLEET_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "crawlfleet.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


class Watch:
    """crawl's progress loop (``_watch``) on a thread, its plain lines captured."""

    def __init__(self, settings: Settings, fleet: Fleet, timeout_s: float) -> None:
        self.out = io.StringIO()
        self.drained: bool | None = None
        console = Console(file=self.out, width=600)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       args=(settings, fleet, console, timeout_s))
        self.thread.start()

    def _run(self, settings: Settings, fleet: Fleet, console: Console,
             timeout_s: float) -> None:
        self.drained = _watch(settings, fleet, console, timeout_s, time.monotonic())

    def text(self) -> str:
        return self.out.getvalue()


def test_crawl_and_top_show_the_store_stage_stalled_while_its_store_is_held(
        settings: Settings, site_port: int, fleet_factory: Callable[..., Fleet]) -> None:
    """A reader holds the store when the crawl's store worker starts: the pages pile up
    on crawl.parsed, and within seconds crawl's progress and `top` say the store stage is
    stalled, naming the reader; once the reader is done, the crawl drains, every page
    stored."""
    s = settings
    n = 12
    s.clickhouse_path.mkdir(parents=True)
    env = {**os.environ, **settings_env(s)}
    env.pop("CRAWLFLEET_CONFIG", None)
    reader = subprocess.Popen([sys.executable, "-m", "crawlfleet.cli", "sql", SLOW_SQL],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_until(lambda: (s.clickhouse_path / "status").exists(), 30,
                   "the reader to open the store")
        with BehaviourSite(site_port, {HOST: Behaviour()}) as site:
            create_all_topics(s)
            fleet = fleet_factory(s)
            watch = Watch(s, fleet, 180)
            publish_seeds(s, site.urls(HOST, n))
            lag_at = wait_until(lambda: stage_lags(s)["store"] > 0 and time.monotonic(), 60,
                                "pages waiting for the store")
            says = f"stalled: no store worker (store-0 waiting: store: the store at " \
                f"{s.clickhouse_path} is open in reader pid {reader.pid}"
            wait_until(lambda: says in watch.text(), 30,
                       "crawl's progress to show the stall and why")
            shown_in = time.monotonic() - lag_at
            top = cli(s, "top", "--once")
            assert top.returncode == 0, top.stderr
            assert "stalled: no store worker" in top.stdout, top.stdout
            assert f"reader pid {reader.pid}" in top.stdout, top.stdout
            assert reader.wait(60) == 0
            watch.thread.join(180)
            assert watch.drained, watch.text()[-3000:]
            rows = cli(s, "sql", "SELECT count(), uniqExact(url) FROM pages FINAL",
                       "--format", "tsv")
            assert rows.stdout.split()[-2:] == [str(n), str(n)], rows
    finally:
        if reader.poll() is None:
            reader.kill()
    report("stall-shown", shown_after_lag_s=round(shown_in, 2))


def test_top_shows_a_killed_workers_stage_stalled_at_once(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    """A killed parse worker stays a member of its group until its session times out (it
    is a static member); its stage has lag: `top` says it is stalled at once, because its
    status file names a process that is gone."""
    n = 8
    with BehaviourSite(site_port, {HOST: Behaviour()}) as site:
        create_all_topics(settings)
        ws = fleet(settings)
        ws.start_pipeline()
        ws.all["parse-0"].kill()
        publish_seeds(settings, site.urls(HOST, n))
        lag_at = wait_until(lambda: stage_lags(settings)["parse"] > 0 and time.monotonic(),
                            60, "fetched pages waiting for parse")
        top = cli(settings, "top", "--once")
        shown_in = time.monotonic() - lag_at
        assert top.returncode == 0, top.stderr
        stage = next(ln for ln in top.stdout.splitlines() if ln.strip("│ ").startswith("parse"))
        assert "1: parse-0" in stage, top.stdout  # still a member for Kafka
        assert "stalled: no parse worker (parse-0 dead" in stage, top.stdout
        ws.restart("parse-0")
        wait_drained(settings, ws, 120, lambda: page_counts(settings).final >= n)
        assert page_counts(settings).final == n
    report("dead-member-shown", shown_after_lag_s=round(shown_in, 2))
