"""Hostile-site benchmark: `crawlfleet crawl` of ``sites.hostile_site`` with default settings,
Scrapy beside it on the same site.

    python -m bench.hostile_bench [--port 18700] [--skip-scrapy] [--skip-crawlfleet]
                                  [--crawlfleet-arg ARG ...] [--timeline] [--json-out PATH]

The site (26 traps: slow drips, silent headers, huge bodies, redirect loops) runs in a
thread of this process and logs every request with its start and end. crawlfleet runs as
``crawlfleet crawl`` with the product's defaults (cap, timeouts, attempts, back-off): only
the address policy (the site's hosts but the refused one) and scope ``seeds`` are given, as
the integration test gives them. Printed: the wall time from command to exit, the good
pages stored, every trap's outcome against the one the site declares (contained or not),
and what bounds the wall: the last request of each host and the requests that waited
behind another of their host's. Scrapy crawls the same site with its polite settings at
crawlfleet's default cap, its download timeout, size cap and attempts set to crawlfleet's,
judged by the site's log (what it asked of the off-scope and refused hosts, robots.txt's
disallowed path, each trap). Scrapy reads the main host's whole 600 KiB robots.txt, whose
"Disallow: /" lies past RFC 9309's 500 KiB, so it asks nothing there (0 good pages).

``--one-host`` serves every trap on the main host (the issue 43 shape: one target whose
slow traps' timeouts and failures all land on it). Measured on this machine (2 cores):
one host 366.4 s before issue 43 point 3, 82.8 / 84.9 s after, bounded by ``/drip`` and
``/silent``: three attempts each, one after the other, each the full 20 s timeout; as
served (traps on hosts of their own) 68.6 s before and 68.9 s after, the same bound.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.crawl_bench import add_crawler_args, crawlfleet_command, crawlfleet_env
from bench.peers import REPO_ROOT, run_scrapy
from bench.polite_peers import scrapy_polite_settings
from bench.proc_group import end_group, popen_reaper
from core.config import Settings, load_settings
from sites.hostile_site import HostileSite, Trap

Request = tuple[float, float, str, str]  # started, ended, host, path (site's log)


@dataclass
class TrapOutcome:
    path: str
    expect: str
    got: str
    contained: bool
    requests: int
    first_at: float | None  # seconds from the crawl's first request


@dataclass
class CrawlResult:
    crawler: str
    wall_s: float  # command to exit
    exit_code: int | None
    good_pages: int  # stored 200s
    site_requests: int
    traps: list[TrapOutcome] = field(default_factory=list)
    breaches: dict[str, int] = field(default_factory=dict)  # asked where it must not
    last_request_at: dict[str, float] = field(default_factory=dict)  # per host
    waited: list[str] = field(default_factory=list)  # requests started after a host's slow one

    @property
    def contained(self) -> bool:
        return all(t.contained for t in self.traps) and not any(self.breaches.values())


def judge(trap: Trap, url: str, pages: dict[str, int], dead: dict[str, str],
          events: dict[str, set[str]]) -> tuple[str, bool]:
    """What became of a trap's URL in the store, and whether that is what the site declares
    (the integration test's referee, per trap)."""
    if trap.expect == "stored":
        return f"stored {pages.get(url)}", pages.get(url) == 200
    if trap.expect.startswith("redirect"):
        status, seen = pages.get(url, 0), events.get(url, set())
        return f"{status} {','.join(sorted(seen))}", 300 <= status <= 399 and trap.expect in seen
    got = dead.get(url)
    return f"dead {got}" if got else f"stored {pages.get(url)}", got == trap.expect


def stored_outcomes(s: Settings) -> tuple[dict[str, int], dict[str, str], dict[str, set[str]]]:
    """Stored pages (status), dead letters (reason) and fetch events (reasons), by URL: what
    the store holds of a hostile crawl (the hostile-site test reads it the same way)."""
    from infra.store_query import run_query

    _, rows = run_query(s, "SELECT url, status FROM pages FINAL")
    pages = {str(u): int(st) for u, st in rows}
    _, rows = run_query(s, "SELECT url, reason FROM dead_letters FINAL")
    dead = {str(u): str(r) for u, r in rows}
    _, rows = run_query(s, "SELECT url, reason FROM fetch_events FINAL")
    events: dict[str, set[str]] = {}
    for u, r in rows:
        events.setdefault(str(u), set()).add(str(r))
    return pages, dead, events


def breaches(site: HostileSite, attempts: int) -> dict[str, int]:
    """Requests no crawler may send: to the off-scope and refused hosts, robots.txt's
    disallowed path, any URL beyond ``attempts``."""
    return {"off-scope host": sum(site.requests(site.off_scope).values()),
            "refused host": sum(site.requests(site.refused).values()),
            "robots-disallowed": site.requests(site.main)["/private/secret"],
            "asked > attempts": sum(max(0, n - attempts) for n in site.requests().values())}


def hostile_site(port: int, one_host: bool) -> HostileSite:
    """The site as served (the traps that time out or fail retryably on hosts of their
    own), or with every trap on the main host: one target that struggles."""
    if one_host:
        main = HostileSite(port).main
        return HostileSite(port, own_hosts=(main,) * 4)
    return HostileSite(port)


def timeline_bounds(log: list[Request], t0: float, slow_s: float = 1.0
                    ) -> tuple[dict[str, float], list[str]]:
    """Each host's last request (s from ``t0``), and the requests that started while a slow
    one (over ``slow_s``) of the same host was in flight, after it: the queue a slow page
    makes, if any."""
    last: dict[str, float] = {}
    for started, _, host, _ in log:
        last[host] = max(last.get(host, 0.0), started - t0)
    waited = []
    for started, ended, host, path in log:
        if ended - started < slow_s:
            continue
        behind = [p for s2, _, h2, p in log if h2 == host and started < s2 < ended]
        if behind:
            waited.append(f"{host}{path} [{started - t0:.1f}-{ended - t0:.1f}s]: "
                          f"{len(behind)} started during it")
    return last, waited


def _trap_outcomes(site: HostileSite, log: list[Request], t0: float,
                   store: tuple[dict[str, int], dict[str, str], dict[str, set[str]]] | None,
                   attempts: int) -> list[TrapOutcome]:
    out = []
    for path, trap in site.traps.items():
        host = site.host_of[path]
        starts = sorted(s for s, _, h, p in log if h == host and p == path)
        if store is not None:
            got, ok = judge(trap, site.url(path), *store)
        else:  # a peer: judged by the site's side only (asked, not beyond its attempts)
            got, ok = f"asked {len(starts)}x", 1 <= len(starts) <= attempts
        out.append(TrapOutcome(path, trap.expect, got, ok, len(starts),
                               starts[0] - t0 if starts else None))
    return out


def run_crawlfleet_hostile(command: list[str], site: HostileSite, s: Settings,
                           extra: list[str], timeout_s: float, output: Path
                           ) -> tuple[CrawlResult, list[Request]]:
    """``crawlfleet crawl`` of ``site`` (not yet started) with the defaults ``s``."""
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp, site:
        seeds, data, summary = Path(tmp, "seeds.txt"), Path(tmp, "data"), Path(tmp, "s.json")
        seeds.write_text("\n".join(site.seeds()) + "\n")
        allow = ",".join(h for h in site.hosts if h != site.refused)
        argv = [*command, "crawl", str(seeds), "--allow-hosts", allow, "--scope", "seeds",
                "--data-dir", str(data), "--summary-json", str(summary),
                "--timeout", f"{timeout_s:g}", *extra]
        env = crawlfleet_env()
        with output.open("ab") as out:
            started = time.monotonic()
            proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code: int | None = proc.wait(timeout=timeout_s + 120)
            except subprocess.TimeoutExpired:
                end_group(proc.pid, popen_reaper(proc), 30.0)
                code = None
            wall = time.monotonic() - started
        log = sorted(site.timeline())
        store = stored_outcomes(load_settings(data_dir=data))
        result = CrawlResult("crawlfleet", wall, code,
                             sum(1 for st in store[0].values() if st == 200), len(log),
                             _trap_outcomes(site, log, log[0][0] if log else started, store,
                                            s.max_attempts),
                             breaches(site, s.max_attempts))
        t0 = log[0][0] if log else started
        result.last_request_at, result.waited = timeline_bounds(log, t0)
    return result, log


def run_scrapy_hostile(site: HostileSite, s: Settings, timeout_s: float
                       ) -> tuple[CrawlResult, list[Request]]:
    """Scrapy polite at crawlfleet's cap, with its timeout, size cap and attempts, on
    ``site`` (not yet started)."""
    settings = {**scrapy_polite_settings(s.rate_cap, 16),
                "DOWNLOAD_TIMEOUT": s.request_timeout_s, "DOWNLOAD_MAXSIZE": s.max_response_bytes,
                "RETRY_TIMES": s.max_attempts - 1, "REDIRECT_MAX_TIMES": s.max_redirects}
    with site:
        hosts = sorted({site.main, *site.host_of.values()})
        started = time.monotonic()
        try:
            peer = run_scrapy(site.seeds(), hosts, 16, settings=settings,
                              name="scrapy (polite)", timeout=timeout_s)
            wall, code, pages = peer.process_seconds, 0, peer.statuses.get("200", 0)
        except RuntimeError:
            wall, code, pages = time.monotonic() - started, None, 0
        log = sorted(site.timeline())
        t0 = log[0][0] if log else started
        result = CrawlResult("scrapy (polite)", wall, code, pages, len(log),
                             _trap_outcomes(site, log, t0, None, s.max_attempts),
                             breaches(site, s.max_attempts))
        result.last_request_at, result.waited = timeline_bounds(log, t0)
    return result, log


def _traps_table(results: list[CrawlResult]) -> Table:
    table = Table(title="traps: outcome (contained?), requests, first asked at s")
    table.add_column("trap")
    table.add_column("expected")
    for r in results:
        table.add_column(r.crawler)
    by = [{t.path: t for t in r.traps} for r in results]
    for path, first in by[0].items():
        cells = []
        for b in by:
            t = b[path]
            mark = "[green]ok[/]" if t.contained else "[red]NOT CONTAINED[/]"
            at = f"{t.first_at:.1f}" if t.first_at is not None else "-"
            cells.append(f"{t.got} {mark} x{t.requests} @{at}")
        table.add_row(path, first.expect, *cells)
    return table


def _summary_table(results: list[CrawlResult]) -> Table:
    table = Table(title="hostile site, default settings: command to exit")
    for col in ("crawler", "wall s", "exit", "good pages", "site requests", "traps contained",
                "breaches", "last request per host (s)"):
        table.add_column(col)
    for r in results:
        ok = sum(t.contained for t in r.traps)
        table.add_row(r.crawler, f"{r.wall_s:.1f}", str(r.exit_code), str(r.good_pages),
                      str(r.site_requests), f"{ok}/{len(r.traps)}",
                      ", ".join(f"{k} {v}" for k, v in r.breaches.items() if v) or "none",
                      ", ".join(f"{h.rsplit('.', 1)[1]}:{t:.0f}"
                                for h, t in sorted(r.last_request_at.items())))
    return table


def print_timeline(console: Console, name: str, log: list[Request]) -> None:
    """Every request, by start: offset, duration, host, path (what waited behind what)."""
    if not log:
        return
    t0 = log[0][0]
    console.print(f"[bold]{name}: every request (start s, took s, host, path)[/]")
    for started, ended, host, path in log:
        console.print(f"  {started - t0:7.2f} {ended - started:6.2f}  {host}  {path[:60]}",
                      markup=False, highlight=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=18700)
    add_crawler_args(parser, bare=False)
    parser.add_argument("--timeout", type=float, default=600.0, help="per-crawler seconds")
    parser.add_argument("--timeline", action="store_true", help="print every request")
    parser.add_argument("--one-host", action="store_true",
                        help="every trap on the main host (one struggling target)")
    parser.add_argument("--output", type=Path, default=Path("bench/out/hostile_crawl.log"),
                        help="crawlfleet's progress and summary go here")
    parser.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    defaults = load_settings()
    results: list[CrawlResult] = []
    logs: dict[str, list[Request]] = {}
    if not args.skip_crawlfleet:
        command = crawlfleet_command(args.crawlfleet_cmd)
        if command is None:
            console.print("[red]crawlfleet command not found[/]; pass --crawlfleet-cmd")
            return 2
        args.output.parent.mkdir(parents=True, exist_ok=True)
        console.print(f"crawlfleet crawl (defaults: cap {defaults.rate_cap:g}/s, timeout "
                      f"{defaults.request_timeout_s:g} s, {defaults.max_attempts} attempts) ...")
        r, logs["crawlfleet"] = run_crawlfleet_hostile(
            command, hostile_site(args.port, args.one_host), defaults,
            list(args.crawlfleet_arg), args.timeout, args.output)
        results.append(r)
        console.print(f"  {r.wall_s:.1f} s, exit {r.exit_code}, {r.good_pages} good pages")
    if not args.skip_scrapy:
        console.print("scrapy (polite, crawlfleet's cap, timeout, size cap, attempts) ...")
        r, logs["scrapy"] = run_scrapy_hostile(hostile_site(args.port, args.one_host),
                                               defaults, args.timeout)
        results.append(r)
        console.print(f"  {r.wall_s:.1f} s, exit {r.exit_code}, {r.good_pages} good pages")
    if not results:
        return 0
    console.print(_summary_table(results))
    console.print(_traps_table(results))
    for r in results:
        for line in r.waited:
            console.print(f"  {r.crawler}: {line}", markup=False, highlight=False)
    if args.timeline:
        for name, log in logs.items():
            print_timeline(console, name, log)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({
            "results": [{**asdict(r), "contained": r.contained} for r in results],
            "timeline": {n: [[round(a, 3), round(b, 3), h, p] for a, b, h, p in log]
                         for n, log in logs.items()},
            "hosts_asked": {n: dict(Counter(h for _, _, h, _ in log)) for n, log in logs.items()},
        }, indent=2))
    fleet = next((r for r in results if r.crawler == "crawlfleet"), None)
    return 0 if fleet is None or (fleet.contained and fleet.exit_code == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
