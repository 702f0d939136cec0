"""A crawl of the project's own hostile site, on real parts (broker, stage processes, chDB).

Every trap ends the way ``infra.hostile_site.TRAPS`` declares: stored harmlessly, or
dead-lettered / recorded with its failure class. Nothing off scope, disallowed or refused
by the address policy is ever requested (the site counts every request); the workers'
memory stays bounded; the crawl drains by itself well under a minute.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from fleet_helpers import report
from rich.console import Console

from crawlfleet.config import Settings
from crawlfleet.crawl import Plan, print_summary, run_crawl
from infra.clickhouse import run_query
from infra.hostile_site import HostileSite

pytestmark = pytest.mark.integration

MB = 1024 * 1024


class PeakRSS:
    """Samples the resident memory of this test's worker processes, per stage."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = str(os.getpid())
        while not self._stop.wait(0.2):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    if stat[1] != me:
                        continue
                    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
                except (OSError, IndexError, ValueError):
                    continue
                if b"worker" in args:
                    stage = args[args.index(b"worker") + 1].decode()
                    self.peak[stage] = max(self.peak.get(stage, 0), rss)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def test_hostile_site_is_crawled_safely(settings: Settings, site_port: int) -> None:
    with HostileSite(site_port) as site:
        s = settings.replace(
            allow_private=False,  # the refused host is the one not listed
            allow_hosts=tuple(h for h in site.hosts if h != site.refused),
            scope="seeds", request_timeout_s=2.0, connect_timeout_s=1.0, max_response_bytes=2 * MB,
            max_attempts=2, rate_cap=50.0, max_redirects=5)
        started = time.monotonic()
        with PeakRSS() as rss:
            summary = run_crawl(s, site.seeds(), Plan(), timeout_s=120)
        took = time.monotonic() - started
        main, off, refused = (site.requests(h) for h in (site.main, site.off_scope,
                                                         site.refused))
        own = {p: site.requests(site.host_of[p]) for p, t in site.traps.items() if t.own_host}
    print_summary(summary, Console(stderr=True))
    report("hostile_crawl", seconds=round(took, 1),
           peak_rss_mb={k: round(v / MB) for k, v in rss.peak.items()},
           dead=summary.dead_by_reason, failed=summary.errors_by_class)

    assert summary.drained, "the crawl must end by itself"
    assert took < 60, f"took {took:.0f}s"
    # Nothing off scope, nothing from a refused address, nothing robots.txt disallows.
    assert off == {} and refused == {}, (off, refused)
    assert main["/private/secret"] == 0 and main["/robots.txt"] == 1
    assert main["/chain/6"] == 0 and main["/chain/5"] == 1  # five hops, then no more

    _, rows = run_query(s, "SELECT url, status FROM pages FINAL")
    pages = {str(u): int(st) for u, st in rows}
    _, rows = run_query(s, "SELECT url, reason FROM dead_letters FINAL")
    dead = {str(u): str(r) for u, r in rows}
    _, rows = run_query(s, "SELECT url, reason FROM fetch_events FINAL")
    events: dict[str, set[str]] = {}
    for u, r in rows:
        events.setdefault(str(u), set()).add(str(r))
    # Retryable traps were tried max_attempts times, the others once.
    assert all(hits == {p: 2, "/robots.txt": 1} for p, hits in own.items()), own

    for trap_path, trap in site.traps.items():
        path = site.url(trap_path)
        if trap.expect == "stored":
            assert pages.get(path) == 200, (path, trap.what, dead.get(path))
        elif trap.expect.startswith("redirect"):
            assert 300 <= pages.get(path, 0) <= 399, (path, trap.what)
            assert trap.expect in events.get(path, set()), (path, events.get(path))
        else:
            assert dead.get(path) == trap.expect, (path, trap.what, dead.get(path))
    assert pages[site.url("/")] == 200 and pages[site.url("/good/2")] == 200
    assert "redirect_loop" in events[site.url("/chain/5")]
    assert dead[f"http://{site.refused}:{site.port}/"] == "address_not_allowed"
    assert "--allow-hosts" in summary.address_hints[site.refused]
    # Memory stays bounded: bodies are capped while streaming, bombs cut at the cap.
    assert rss.peak["fetch"] < 400 * MB, rss.peak
