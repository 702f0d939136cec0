"""Crawls of the project's own hostile site, on real parts (broker, stage processes, chDB).

Every trap ends the way ``sites.hostile_site`` declares: stored harmlessly, or
dead-lettered / recorded with its failure class. Nothing off scope, disallowed or refused
by the address policy is ever requested (the site counts every request); the workers'
memory stays bounded; each crawl drains by itself. Three crawls:

- the main one (scope ``seeds``): every page trap, the refused host in six spellings (each
  one job under its canonical URL, ``address_not_allowed``) and the main host in one (the
  same job as ``/good/1``), non-UTF-8 header bytes (stored; a non-UTF-8 Location is
  followed to its bytes percent-encoded), a title that is console markup (stored as written,
  printed as written by ``crawlfleet trace``) and a 301 on every link of ``/up/`` (each
  301 recorded, each page stored, nine levels past ``max_redirects``);
- scope ``any`` with the metadata address: a link and a 302 to 169.254.169.254 (their jobs
  ``address_not_allowed``) and a host whose robots.txt redirects there (its jobs
  ``robots_unreachable``, its page never requested);
- 12,000 minted hosts in 127.1.0.0/16 (wildcard DNS without DNS: nothing listens there, so
  each connect is refused on loopback and each job ends ``robots_unreachable``): every
  per-target map of the fetch worker stays within ``max_target_state`` at its peak.

None of them may send a packet off loopback even if a guard breaks: the fleet allows only
the site's own addresses (never ``allow_private``), and a ``socket.connect`` audit hook in
every process of these tests refuses and records any address outside 127.0.0.0/8
(``audit/connect_audit.py``); each test asserts it recorded nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from audit import connect_audit
from fleet_helpers import report
from rich.console import Console
from typer.testing import CliRunner

from bench.hostile_bench import stored_outcomes
from core.config import Settings
from crawlfleet.cli import app
from crawlfleet.crawl import Plan, print_summary, run_crawl
from infra.store_query import run_query
from sites.hostile_site import (
    LOCATION_BYTES_TARGET,
    MAIN_SPELLING,
    MARKUP_TITLE,
    REFUSED_SPELLINGS,
    ROBOTS_REDIRECT_EXPECT,
    UP_LEVELS,
    HostileSite,
    metadata_outcomes,
)

pytestmark = pytest.mark.integration

MB = 1024 * 1024
AUDIT_DIR = Path(__file__).parent / "audit"


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
                # `crawlfleet worker STAGE` or the crawl's `-m crawlfleet.worker_main STAGE`
                mark = next((m for m in (b"worker", b"crawlfleet.worker_main") if m in args),
                            None)
                if mark is not None:
                    stage = args[args.index(mark) + 1].decode()
                    self.peak[stage] = max(self.peak.get(stage, 0), rss)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file where every process of this test records connects off loopback (each one
    refused): the workers load the hook through ``sitecustomize`` on ``PYTHONPATH``, this
    process installs it (it acts only while the variable is set, i.e. in these tests)."""
    log = tmp_path / "connects-off-loopback.log"
    inherited = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(AUDIT_DIR), inherited) if p))
    monkeypatch.setenv(connect_audit.ENV, str(log))
    connect_audit.install()
    return log


def _refused(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_connect_audit_refuses_off_loopback_before_connecting(audit: Path) -> None:
    """The hook records and refuses a plain connect and the fetch stage's own (its event
    loop and client, with a guard that allows everything), and lets loopback through."""
    code = textwrap.dedent("""
        import asyncio, socket
        from consumers.fetch.stage import _loop_factory
        from consumers.fetch.http import Fetcher
        from core.config import Settings
        from core.errors import CrawlfleetError
        try:
            socket.create_connection(("10.255.255.1", 9), timeout=1)
        except PermissionError:
            print("plain refused")
        assert _loop_factory() is None, "uvloop connects in C, unaudited"
        async def fetch():
            broken_guard = Settings(allow_private=True, connect_timeout_s=1.0,
                                    request_timeout_s=2.0)
            async with Fetcher(broken_guard) as f:
                try:
                    await f.get("http://10.255.255.1:9/latest/meta-data/")
                except CrawlfleetError as exc:
                    print("fetch refused", exc.reason)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(fetch())
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1).close()
        except OSError as exc:
            print("loopback", type(exc).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "plain refused" in out.stdout and "fetch refused connect" in out.stdout, out.stdout
    lines = _refused(audit)
    assert len(lines) == 2 and all("('10.255.255.1', 9)" in ln for ln in lines), lines
    audit.unlink()
    with pytest.raises(PermissionError):  # this process has it too
        socket.create_connection(("10.255.255.1", 9), timeout=1)
    assert len(_refused(audit)) == 1


def test_hostile_site_is_crawled_safely(settings: Settings, site_port: int,
                                        audit: Path) -> None:
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
    assert _refused(audit) == [], "a connect off loopback was attempted"
    # Nothing off scope, nothing from a refused address, nothing robots.txt disallows.
    assert off == {} and refused == {}, (off, refused)
    assert main["/private/secret"] == 0 and main["/robots.txt"] == 1
    assert main["/chain/6"] == 0 and main["/chain/5"] == 1  # five hops, then no more

    pages, dead, events = stored_outcomes(s)
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
    assert "internal" not in summary.dead_by_reason, summary.dead_by_reason
    assert pages[site.url("/")] == 200 and pages[site.url("/good/2")] == 200
    assert "redirect_loop" in events[site.url("/chain/5")]
    assert dead[f"http://{site.refused}:{site.port}/"] == "address_not_allowed"
    assert "--allow-hosts" in summary.address_hints[site.refused]
    # The refused host in six spellings: six jobs under their canonical URLs, all refused
    # (and the host never asked, above); the main host spelt in hex is /good/1 once more.
    for _, path in REFUSED_SPELLINGS:
        assert dead.get(f"http://{site.refused}:{site.port}{path}") == "address_not_allowed", \
            (path, dead.get(f"http://{site.refused}:{site.port}{path}"))
    assert main[MAIN_SPELLING[1]] == 1, main
    # A non-UTF-8 Location is followed to its bytes, percent-encoded as sent.
    assert pages.get(site.base + LOCATION_BYTES_TARGET) == 200, LOCATION_BYTES_TARGET
    assert main[LOCATION_BYTES_TARGET] == 1
    # A 301 on every link: each hop recorded, each page stored, all nine levels.
    for n in range(UP_LEVELS):
        assert pages.get(f"{site.base}/up/{n}") == 301, (n, pages.get(f"{site.base}/up/{n}"))
        assert pages.get(f"{site.base}/up/{n}/") == 200, n
        assert main[f"/up/{n}"] == 1 and main[f"/up/{n}/"] == 1, n
    # A title that is console markup: stored as written, and printed as written.
    markup_url = site.url("/markup-title")
    _, rows = run_query(s, "SELECT url, title FROM pages FINAL")
    assert {str(u): str(t) for u, t in rows}[markup_url] == MARKUP_TITLE
    out = CliRunner().invoke(app, ["trace", markup_url], env={
        "CRAWLFLEET_DATA_DIR": str(s.data_dir), "COLUMNS": "400"})
    assert out.exit_code == 0, (out.output, out.exception)
    assert MARKUP_TITLE in out.output and "\x1b]8;" not in out.output, out.output
    # Memory stays bounded: bodies are capped while streaming, bombs cut at the cap.
    assert rss.peak["fetch"] < 400 * MB, rss.peak


def test_the_metadata_address_is_never_reached(settings: Settings, site_port: int,
                                               audit: Path) -> None:
    """Scope ``any``, so nothing but the address policy stands between a link (or a
    redirect, or robots.txt's redirect) and 169.254.169.254. ``max_attempts=1``: a job whose
    robots.txt is unreachable would otherwise wait a minute for its retry."""
    with HostileSite(site_port) as site:
        s = settings.replace(
            allow_private=False, allow_hosts=tuple(h for h in site.hosts if h != site.refused),
            scope="any", request_timeout_s=2.0, connect_timeout_s=1.0, max_attempts=1,
            max_redirects=5)
        started = time.monotonic()
        summary = run_crawl(s, site.metadata_seeds(), Plan(), timeout_s=120)
        took = time.monotonic() - started
        robots_host = site.requests(site.robots_redirect)
    report("hostile_metadata", seconds=round(took, 1), dead=summary.dead_by_reason)
    assert summary.drained, "the crawl must end by itself"
    assert _refused(audit) == [], "a connect off loopback was attempted"

    pages, dead, events = stored_outcomes(s)
    for path, trap in site.metadata.items():
        url = site.base + path
        if trap.expect == "stored":
            assert pages.get(url) == 200, (url, dead.get(url))
        else:
            assert 300 <= pages.get(url, 0) <= 399 and trap.expect in events.get(url, set()), \
                (url, pages.get(url), events.get(url))
    for url, reason in metadata_outcomes().items():
        assert dead.get(url) == reason, (url, dead.get(url))
    # The origin is allowed, its robots.txt redirects where nothing may be fetched: that
    # robots.txt is unreachable (complete disallow, RFC 9309 §2.3.1.4), not the origin refused.
    assert robots_host == {"/robots.txt": 1}, robots_host
    assert dead.get(site.robots_redirect_page) == ROBOTS_REDIRECT_EXPECT, \
        dead.get(site.robots_redirect_page)


def _fetch_status(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    (fetch,) = [st for st in statuses if st.get("stage") == "fetch"]
    return fetch


PEAKS = ("target_slots_peak", "robots_rules_peak", "robots_intervals_peak",
         "target_health_peak")


def test_minted_hosts_leave_every_map_within_its_bound(settings: Settings, site_port: int,
                                                       audit: Path) -> None:
    """A site minting hosts (12,000, past the default bound of 10,000) with the product's
    defaults for ``max_target_state`` and ``target_idle_s``: every per-target map of the
    fetch worker stays within the bound at its peak, and idle targets were forgotten."""
    with HostileSite(site_port) as site:
        s = settings.replace(
            allow_private=False, allow_hosts=(*site.hosts, "127.1.0.0/16"), scope="any",
            request_timeout_s=2.0, connect_timeout_s=1.0, max_attempts=1)
        bound = s.max_target_state
        assert bound == Settings().max_target_state == 10_000
        assert s.target_idle_s == Settings().target_idle_s
        minted = site.minted()
        assert len(minted) > bound
        started = time.monotonic()
        with PeakRSS() as rss:
            summary = run_crawl(s, site.mint_seeds(), Plan(), timeout_s=240)
        took = time.monotonic() - started
        asked = site.requests(site.main)
    fetch = _fetch_status(summary.statuses)
    gauges, counters = fetch["gauges"], fetch["counters"]
    report("hostile_minted_hosts", seconds=round(took, 1), hosts=len(minted), bound=bound,
           peaks={k: gauges.get(k) for k in PEAKS},
           end={k[:-5]: gauges.get(k[:-5]) for k in PEAKS},
           targets_forgotten=counters.get("targets_forgotten", 0),
           parked_for_room=counters.get("parked", 0),
           peak_rss_mb={k: round(v / MB) for k, v in rss.peak.items()},
           dead=summary.dead_by_reason)

    assert summary.drained, "the crawl must end by itself"
    assert _refused(audit) == [], "a connect off loopback was attempted"
    assert asked == {"/robots.txt": 1, **{p[len(site.base):]: 1 for p in site.mint_seeds()}}
    # Every minted host's job ended: its robots.txt could not be fetched (refused
    # connection), so nothing there may be: dead-lettered robots_unreachable, one attempt.
    _, rows = run_query(s, "SELECT reason, count(), uniqExact(url) FROM dead_letters FINAL "
                        "WHERE startsWith(url, 'http://127.1.') GROUP BY reason")
    assert [(str(r), int(n), int(u)) for r, n, u in rows] == [
        ("robots_unreachable", len(minted), len(minted))], rows
    for name in PEAKS:
        assert 0 <= gauges[name] <= bound, (name, gauges[name])
    assert gauges["target_slots_peak"] >= bound * 9 // 10, "the bound was reached"
    assert counters["targets_forgotten"] >= 2_000, counters.get("targets_forgotten")
