"""The embedded store survives its readers and its own restarts (real broker, real chDB).

chDB admits one process per store path. A reader (``crawlfleet sql``, top, doctor...)
that opened the path while a store worker was restarting used to make the worker fail
("Cannot lock file .../status") and exit for good: the crawl stood still, half its pages
never stored, and nothing said why. Now a reader never opens the path while a store worker
lives, and a store worker that finds the store held waits, says who holds it, and starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fleet_helpers import (
    Worker,
    Workers,
    create_all_topics,
    group_assignment,
    page_counts,
    publish_seeds,
    report,
    slow_sql,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from core.errors import CrawlfleetError
from crawlfleet.crawl import settings_env
from infra.store_query import query_owner
from sites.behaviour_site import Behaviour, BehaviourSite

pytestmark = pytest.mark.integration

#: A query a person might leave running: 12 s.
SLOW_SQL = slow_sql(12)


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {**os.environ, **settings_env(settings), **extra}
    env.pop("CRAWLFLEET_CONFIG", None)
    return env


def sql(settings: Settings, query: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``crawlfleet sql QUERY --format tsv``, as a person types it."""
    return subprocess.run([sys.executable, "-m", "crawlfleet.cli", "sql", query,
                           "--format", "tsv"], env=cli_env(settings), capture_output=True,
                          text=True, timeout=timeout, check=False)


def engine_open(settings: Settings) -> bool:
    """Some process has the chDB engine open on the path (it keeps a ``status`` file there
    while it runs and removes it on close): true of every version of crawlfleet."""
    return (settings.clickhouse_path / "status").exists()


def serves(settings: Settings, worker: Worker) -> bool:
    """``worker`` (this very process) answers queries on the port it wrote -- checked over
    HTTP, never by opening chDB here (a stale port file would make run_query do that)."""
    st = worker.status()
    if not worker.alive() or st.get("pid") != worker.pid or st.get("waiting"):
        return False
    try:
        return query_owner(settings.clickhouse_path, "SELECT 1")[1] == [[1]]
    except (OSError, ValueError, KeyError, CrawlfleetError):
        return False


def metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def test_a_store_worker_waits_for_a_reader_and_then_starts(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """A reader holds the store (a slow `crawlfleet sql`) when the store worker starts:
    the worker does not exit; its log, status, Prometheus gauge and `crawlfleet doctor`
    name the reader; it starts as soon as the reader is done, and serves queries."""
    create_all_topics(settings)
    settings.clickhouse_path.mkdir(parents=True)
    reader = subprocess.Popen([sys.executable, "-m", "crawlfleet.cli", "sql", SLOW_SQL,
                               "--format", "tsv"], env=cli_env(settings),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: engine_open(settings), 30, "the reader to open the store")
        ws = fleet(settings)
        store = ws.start("store", "store-0", env={"CRAWLFLEET_METRICS_PORT": "0"})
        began = time.monotonic()

        def waiting() -> bool:
            assert store.alive(), f"the store worker exited:\n{store.log_tail()}"
            return store.gauge("store_waiting") == 1

        wait_until(waiting, 30, "the store worker to say it waits for its store")
        said_in = time.monotonic() - began
        status = store.status()
        assert f"reader pid {reader.pid}" in status["waiting"], status
        assert f"reader pid {reader.pid}" in store.log()
        assert metric(status["metrics_port"], "crawlfleet_store_waiting") == 1.0
        doctor = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "doctor",
                                 "--no-kafka"], env=cli_env(settings, COLUMNS="300"),
                                capture_output=True, text=True, timeout=60, check=False)
        line = next((ln for ln in doctor.stdout.splitlines() if "has its store" in ln), "")
        assert "store-0" in line and f"pid {reader.pid}" in line, doctor.stdout
        out, err = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
    assert reader.returncode == 0 and out.split() == ["s", "0"], (out, err)
    reader_done = time.monotonic()

    def serving() -> bool:
        assert store.alive(), f"the store worker exited:\n{store.log_tail()}"
        return serves(settings, store)

    wait_until(serving, 30, "the store worker to start once the reader let go")
    started_in = time.monotonic() - reader_done
    wait_until(lambda: group_assignment(settings, "store").get("store-0"), 30,
               "the store worker to join its group")
    assert store.gauge("store_waiting") == 0 and not store.status()["waiting"]
    assert metric(store.status()["metrics_port"], "crawlfleet_store_waiting") == 0.0
    assert "Cannot lock" not in store.log()
    report("store-waits-for-reader", said_waiting_s=round(said_in, 2),
           started_after_reader_s=round(started_in, 2))


@dataclass
class Reader:
    """`crawlfleet sql "SELECT count() FROM pages"` in a loop, as an operator watches."""

    settings: Settings
    stop: threading.Event = field(default_factory=threading.Event)
    runs: list[tuple[int, str, str, float]] = field(default_factory=list)  # rc, out, err, s

    def loop(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            out = sql(self.settings, "SELECT count() FROM pages")
            self.runs.append((out.returncode, out.stdout, out.stderr,
                              time.monotonic() - began))


def test_a_store_worker_killed_again_and_again_under_readers_comes_back(
        settings: Settings, fleet: Callable[[Settings], Workers], site_port: int,
        tmp_path: Path) -> None:
    """Kill -9 the store worker every few seconds and restart it at once (a supervisor),
    while two readers run `crawlfleet sql` in a loop: it comes back every time, every page
    is stored exactly once, and no reader ever fails or takes the store from the worker."""
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    n_per_host, kills = 70, 4
    s = settings.replace(rate_cap=4.0)
    with BehaviourSite(site_port, {h: Behaviour() for h in hosts}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        readers = [Reader(s) for _ in range(2)]
        threads = [threading.Thread(target=r.loop, daemon=True) for r in readers]
        for t in threads:
            t.start()
        urls = [u for h in hosts for u in site.urls(h, n_per_host)]
        publish_seeds(s, urls)
        back_in: list[float] = []
        try:
            for _ in range(kills):
                time.sleep(4.0)
                ws.all["store-0"].kill()
                store = ws.restart("store-0")
                killed = time.monotonic()

                def serving(store: Worker = store) -> bool:
                    assert store.alive(), \
                        f"the restarted store worker exited:\n{store.log_tail(60)}"
                    return serves(s, store)

                wait_until(serving, 60, "the restarted store worker to serve")
                back_in.append(round(time.monotonic() - killed, 2))
            wait_drained(s, ws, 180, lambda: page_counts(s).final >= len(urls))
        finally:
            for r in readers:
                r.stop.set()
            for t in threads:
                t.join(120)
        counts = page_counts(s)
        stored = stored_pages(s)
    runs = [run for r in readers for run in r.runs]
    failed = [run for run in runs if run[0] != 0]
    waited = [run for run in runs if "waiting up to" in run[2]]
    report("store-kill-under-readers", kills=kills, back_in_s=back_in, reader_runs=len(runs),
           reader_failures=len(failed), reader_waits=len(waited),
           slowest_reader_s=round(max(run[3] for run in runs), 2), pages=counts.final,
           raw_rows=counts.raw)
    store = ws.all["store-0"]
    assert store.alive() and store.starts == kills + 1
    assert "Cannot lock" not in store.log(), store.log_tail(80)
    assert not failed, failed[:3]
    assert all(run[1].split()[0] == "count()" for run in runs), runs[:3]
    assert counts.final == counts.urls == counts.keys == len(urls), counts
    assert set(stored) == set(urls) and set(stored.values()) == {200}
    assert len(runs) >= 2 * kills  # the readers really read throughout
