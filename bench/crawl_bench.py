"""Crawl benchmark: crawlfleet against Scrapy and a bare aiohttp loop on the same local site.

    python -m bench.crawl_bench [--pages 10000] [--hosts 8] [--concurrency 64] [--port 18500]
                                [--repeat 3] [--warmup-pages 2000]
                                [--skip-crawlfleet] [--json-out bench/out/crawl_bench.json]

The site (``sites.bench_site.bench_spec``) runs in a thread of *this* process, and every crawler
runs as its own subprocess, so no crawler's CPU time or memory includes the site's. Each
crawler gets a fresh server (fresh counters) for every run. Runs are interleaved in rounds
(bare aiohttp, Scrapy, crawlfleet; ``--repeat`` rounds) so a slow phase of a shared machine
hits every crawler alike, and each crawler's median run is reported, with all runs listed.
crawlfleet first gets one uncounted warm-up crawl: it starts the local broker if none runs,
and a fresh JVM spends its first seconds compiling -- a cost of a broker's first minute, not
of a crawl. The server's request log is the referee: every run must fetch exactly the
expected pages, none twice, nothing robots.txt disallows.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.peers import REPO_ROOT, PeerResult, run_bare_aiohttp, run_scrapy
from bench.proc_costs import ChildCpu, ProcCosts, broker_pids
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite
from sites.site_spec import SiteSpec

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Run:
    """A peer's result plus what the server saw while it ran."""

    result: PeerResult
    expected: int
    site_requests: int
    refetched: int  # requests beyond the first for the same URL
    disallowed_fetched: int  # requests for robots-disallowed URLs
    peak_pss_mb: float | None = None  # crawlfleet only: shared pages counted once
    peak_breakdown: dict[str, float] | None = None  # crawlfleet only: MB per command at peak
    all_pages_per_s: list[float] | None = None  # every run of this crawler, in run order
    every_run_exact: bool = True

    @property
    def exact(self) -> bool:
        return (
            self.result.pages == self.expected
            and self.refetched == 0
            and self.disallowed_fetched == 0
        )

    @property
    def complete(self) -> bool:
        return self.exact and self.every_run_exact


def median_run(runs: list[Run]) -> Run:
    """The run with the median pages/s (the lower one of an even count), knowing the others."""
    ranked = sorted(runs, key=lambda r: r.result.pages_per_s)
    chosen = ranked[(len(ranked) - 1) // 2]
    chosen.all_pages_per_s = [r.result.pages_per_s for r in runs]
    chosen.every_run_exact = all(r.exact for r in runs)
    return chosen


# -- process-tree memory ---------------------------------------------------------------------------


def _descendants(root: int) -> list[int]:
    """``root`` and every live process below it, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def _proc_rss(pid: int) -> tuple[str, int] | None:
    """(command name, RSS bytes) of ``pid``, or None if it has gone (cheap: statm)."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE_SIZE
        return name, rss
    except (OSError, ValueError, IndexError):
        return None


class TreeMemorySampler:
    """Samples a process tree's summed RSS every ``interval`` s and keeps the peak.

    crawlfleet spawns stage processes, so the parent's own peak would understate it; summed
    RSS counts pages shared between processes once per process (an upper bound), so a summed
    PSS peak is kept too. The sampler runs beside the crawl it measures, so it keeps its own
    cost small (a few ms per second): the tree is re-read once a second, and PSS (a page
    table walk per process) only on every ``pss_every``-th sample.
    """

    def __init__(self, root_pid: int, interval: float = 0.2, pss_every: int = 5) -> None:
        self.root_pid = root_pid
        self.interval = interval
        self.pss_every = pss_every
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_breakdown: dict[str, int] = {}
        self._pids: list[int] = []
        self._brokers: set[int] = set()  # followed after they leave the tree (daemons)
        self.costs = ProcCosts()  # CPU and peak PSS per process, by role
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._brokers = set(broker_pids())  # a running broker: counted from now
        self.costs.watch_outside(sorted(self._brokers))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        if self._samples % max(1, int(1.0 / self.interval)) == 0:
            self._pids = _descendants(self.root_pid)
            self._brokers.update(p for p in self._pids if p in self.costs.procs
                                 and self.costs.procs[p].role == "broker")
        with_pss = self._samples % self.pss_every == 0
        self._samples += 1
        rss = 0
        by_name: dict[str, int] = {}
        for pid in self._pids:
            mem = _proc_rss(pid)
            if mem is None:
                continue
            name, r = mem
            rss += r
            by_name[name] = by_name.get(name, 0) + r
        pss = self.costs.sample(self._pids, with_pss)
        self.costs.sample(sorted(self._brokers - set(self._pids)), with_pss)
        if rss > self.peak_rss:
            self.peak_rss = rss
            self.peak_breakdown = by_name
        self.peak_pss = max(self.peak_pss, pss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


# -- crawlfleet ------------------------------------------------------------------------------------


def crawlfleet_command(override: str | None) -> list[str] | None:
    """How to start crawlfleet: an override, the installed script, or its module in this tree."""
    if override:
        return shlex.split(override)
    script = shutil.which("crawlfleet") or shutil.which(
        "crawlfleet", path=str(Path(sys.executable).parent)
    )
    if script:
        return [script]
    if (REPO_ROOT / "crawlfleet" / "cli.py").exists():
        return [sys.executable, "-c", "from crawlfleet.cli import app; app()"]
    return None


def crawlfleet_argv(
    command: list[str], seeds: Path, summary: Path, data_dir: Path, extra_args: list[str]
) -> list[str]:
    """``crawlfleet crawl`` as the benchmarks run it: uncapped unless ``extra_args`` set
    ``--rate-cap`` again (a click option given twice takes its last value)."""
    return [
        *command,
        "crawl",
        str(seeds),
        "--allow-private",
        "--rate-cap",
        "100000",
        "--scope",
        "seeds",
        "--summary-json",
        str(summary),
        "--data-dir",
        str(data_dir),
        *extra_args,
    ]


def crawlfleet_env(concurrency: int | None = None) -> dict[str, str]:
    """The environment of a benchmark crawl; ``concurrency`` caps the fetch stage's requests
    in flight, as the peers' is capped."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if concurrency is not None:
        env["CRAWLFLEET_MAX_INFLIGHT"] = str(concurrency)
    return env


def run_crawlfleet(
    command: list[str],
    spec: SiteSpec,
    extra_args: list[str],
    timeout: float,
    concurrency: int | None = None,
    output: Path | None = None,
    summary_sink: dict[str, Any] | None = None,
) -> tuple[PeerResult, TreeMemorySampler]:
    """Run ``crawlfleet crawl`` on the site's seeds; its summary JSON gives pages and time.

    ``concurrency`` caps the fetch stage's requests in flight, as the peers' is capped;
    ``output`` (if given) takes the crawl's progress and summary instead of the terminal;
    ``summary_sink`` (if given) receives the whole summary.
    """
    with tempfile.TemporaryDirectory(prefix="bench-crawlfleet-") as tmp:
        seeds = Path(tmp, "seeds.txt")
        seeds.write_text("\n".join(spec.seeds()) + "\n")
        summary = Path(tmp, "summary.json")
        argv = crawlfleet_argv(command, seeds, summary, Path(tmp, "data"), extra_args)
        env = crawlfleet_env(concurrency)
        started = time.perf_counter()
        # Its own session, so a timeout can end the whole tree it started, and only that.
        out = output.open("ab") if output is not None else None
        clock = ChildCpu()  # the crawl and every stage process it reaps, exactly
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, start_new_session=True, stdout=out, stderr=out
        )
        if out is not None:
            out.close()  # the child holds its own copy
        sampler = TreeMemorySampler(proc.pid)
        sampler.start()
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
            raise RuntimeError(f"crawlfleet did not finish within {timeout:.0f} s") from None
        finally:
            sampler.stop()
        process_seconds = time.perf_counter() - started
        broker = sampler.costs.by_role().get("broker")
        cpu_s = clock.stop() + (broker.cpu_s if broker is not None else 0.0)
        if not summary.exists():
            raise RuntimeError(f"crawlfleet exited with {returncode}: {shlex.join(argv)}")
        # A non-zero exit with a summary (e.g. not drained) is still a result: the table's
        # "exact" column shows it fell short.
        data = json.loads(summary.read_text())
    if summary_sink is not None:
        summary_sink.update(data)
    pages = int(data["pages_stored"])
    # Like the peers' "seconds" (first request to last response), time the crawl from the first
    # page fetched to the last page stored in ClickHouse; start-up and drain detection are in
    # "process s".
    seconds = float(data.get("crawl_seconds") or data["seconds"])
    result = PeerResult(
        name="crawlfleet" if returncode == 0 else f"crawlfleet (exit {returncode})",
        pages=pages,
        seconds=seconds,
        pages_per_s=pages / seconds if seconds else 0.0,
        peak_rss_mb=sampler.peak_rss / 2**20,
        process_seconds=process_seconds,
        cpu_s=cpu_s,
    )
    return result, sampler


# -- driver ----------------------------------------------------------------------------------------


def _with_fresh_site(
    spec: SiteSpec, expected: int, fn: Callable[[], PeerResult | tuple[PeerResult, Any]]
) -> Run:
    with DemoSite(spec) as site:
        out = fn()
        requests = site.snapshot()[0]
    result, sampler = out if isinstance(out, tuple) else (out, None)
    run = Run(
        result=result,
        expected=expected,
        site_requests=sum(requests.values()),
        refetched=sum(n - 1 for n in requests.values() if n > 1),
        disallowed_fetched=sum(n for u, n in requests.items() if "/nofollow/" in u),
    )
    if isinstance(sampler, TreeMemorySampler):
        run.peak_pss_mb = sampler.peak_pss / 2**20
        run.peak_breakdown = {k: v / 2**20 for k, v in sampler.peak_breakdown.items()}
    return run


def _table(runs: list[Run], title: str) -> Table:
    table = Table(title=title)
    table.add_column("crawler")
    for col in ("pages", "expected", "exact", "seconds", "pages/s", "peak RSS MB", "process s",
                "CPU ms/page"):
        table.add_column(col, justify="right")
    for col in ("site requests", "refetched", "disallowed fetched", "pages/s of every run"):
        table.add_column(col, justify="right")
    for r in runs:
        res = r.result
        table.add_row(
            res.name,
            str(res.pages),
            str(r.expected),
            "[green]yes[/]" if r.complete else "[red]NO[/]",
            f"{res.seconds:.2f}",
            f"{res.pages_per_s:,.0f}",
            f"{res.peak_rss_mb:,.1f}",
            f"{res.process_seconds:.2f}",
            f"{1000 * res.cpu_s / res.pages:.2f}" if res.pages else "-",
            str(r.site_requests),
            str(r.refetched),
            str(r.disallowed_fetched),
            ", ".join(f"{v:,.0f}" for v in (r.all_pages_per_s or [res.pages_per_s])),
        )
    return table


def add_crawler_args(parser: argparse.ArgumentParser, bare: bool = True) -> None:
    """The options every benchmark shares: which crawlers run, and how crawlfleet starts."""
    parser.add_argument("--skip-crawlfleet", action="store_true")
    parser.add_argument("--skip-scrapy", action="store_true")
    if bare:
        parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument("--crawlfleet-cmd", help="command to start crawlfleet (default: found)")
    parser.add_argument(
        "--crawlfleet-arg",
        action="append",
        default=[],
        help="extra argument for `crawlfleet crawl` (repeatable)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--port", type=int, default=18500)
    parser.add_argument("--page-bytes", type=int, default=12_000)
    parser.add_argument("--links-per-page", type=int, default=10)
    add_crawler_args(parser)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per-crawler seconds")
    parser.add_argument("--repeat", type=int, default=3, help="runs per crawler (median shown)")
    parser.add_argument(
        "--warmup-pages", type=int, default=2000, help="crawlfleet's uncounted warm-up (0: none)"
    )
    parser.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    # a fixed width when piped, so the table stays readable in logs and CI output
    console = Console(width=None if sys.stdout.isatty() else 150)

    command = None
    if not args.skip_crawlfleet:
        command = crawlfleet_command(args.crawlfleet_cmd)
        if command is None:
            console.print(
                "[red]crawlfleet command not found[/] (no `crawlfleet` on PATH, no "
                "crawlfleet/cli.py); pass --crawlfleet-cmd or --skip-crawlfleet"
            )
            return 2

    spec = bench_spec(args.port, args.pages, args.hosts, args.page_bytes, args.links_per_page)
    expected = len(spec.expected())
    seeds, hosts, conc = spec.seeds(), list(spec.hosts), args.concurrency
    console.print(
        f"site: {args.pages} pages x ~{args.page_bytes} B on {args.hosts} hosts "
        f"({hosts[0]}..{hosts[-1]}:{args.port}), {expected} URLs expected; "
        f"concurrency {conc}; server in-process thread, crawlers in subprocesses; "
        f"{os.cpu_count()} CPUs"
    )

    plan: list[tuple[str, Callable[[], PeerResult | tuple[PeerResult, Any]]]] = []
    if not args.skip_bare:
        plan.append(("bare-aiohttp", lambda: run_bare_aiohttp(seeds, hosts, conc)))
    if not args.skip_scrapy:
        plan.append(("scrapy", lambda: run_scrapy(seeds, hosts, conc)))
    if command is not None:
        cmd = command
        plan.append(
            (
                "crawlfleet",
                lambda: run_crawlfleet(
                    cmd, spec, list(args.crawlfleet_arg), args.timeout, args.concurrency
                ),
            )
        )

    if command is not None and args.warmup_pages > 0:
        wspec = bench_spec(
            args.port, args.warmup_pages, args.hosts, args.page_bytes, args.links_per_page
        )
        console.print(f"warm-up: crawlfleet on {args.warmup_pages} pages (not counted) ...")
        try:
            warm = _with_fresh_site(
                wspec,
                len(wspec.expected()),
                lambda: run_crawlfleet(
                    command, wspec, list(args.crawlfleet_arg), args.timeout, args.concurrency
                ),
            )
            console.print(f"  warm-up: {warm.result.pages_per_s:,.0f} pages/s")
        except RuntimeError as exc:
            console.print(f"[yellow]warm-up failed:[/] {exc}")

    by_crawler: dict[str, list[Run]] = {name: [] for name, _ in plan}
    for round_no in range(1, max(1, args.repeat) + 1):
        for name, fn in plan:
            console.print(f"round {round_no}/{max(1, args.repeat)}: {name} ...")
            try:
                run = _with_fresh_site(spec, expected, fn)
            except RuntimeError as exc:
                console.print(f"[red]{name} failed:[/] {exc}")
                continue
            by_crawler[name].append(run)
            console.print(
                f"  {run.result.pages} pages in {run.result.seconds:.2f} s = "
                f"{run.result.pages_per_s:,.0f} pages/s, peak RSS {run.result.peak_rss_mb:,.1f} MB"
            )
    runs = [median_run(rs) for rs in by_crawler.values() if rs]

    console.print(
        _table(
            runs,
            f"crawl benchmark: {args.pages} pages, concurrency {conc}, "
            f"median of {max(1, args.repeat)} run(s) each",
        )
    )
    by_name = {r.result.name: r for r in runs}
    fleet = next((r for r in runs if r.result.name.startswith("crawlfleet")), None)
    if fleet is not None:
        if fleet.peak_pss_mb is not None:
            console.print(
                f"crawlfleet peak summed PSS (shared pages once): {fleet.peak_pss_mb:,.1f} MB"
            )
        if fleet.peak_breakdown:
            parts = ", ".join(
                f"{k} {v:,.0f}"
                for k, v in sorted(fleet.peak_breakdown.items(), key=lambda x: -x[1])
            )
            console.print(f"crawlfleet RSS at peak by command (MB): {parts}")
        for other in ("scrapy", "bare-aiohttp"):
            peer = by_name.get(other)
            if peer is None or not peer.result.pages_per_s or not peer.result.peak_rss_mb:
                continue
            speed = fleet.result.pages_per_s / peer.result.pages_per_s
            memory = fleet.result.peak_rss_mb / peer.result.peak_rss_mb
            console.print(f"crawlfleet / {other}: pages/s x{speed:.2f}, peak RSS x{memory:.2f}")
    incomplete = [r.result.name for r in runs if not r.complete]
    if incomplete:
        console.print(f"[yellow]did not crawl the site exactly: {', '.join(incomplete)}[/]")

    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "expected": expected,
            "cpus": os.cpu_count(),
            "runs": [{**asdict(r), "complete": r.complete} for r in runs],
            "every_run": {
                name: [{**asdict(r), "exact": r.exact} for r in rs]
                for name, rs in by_crawler.items()
            },
        }
        args.json_out.write_text(json.dumps(payload, indent=2))
    return 0 if all(len(rs) == max(1, args.repeat) for rs in by_crawler.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
