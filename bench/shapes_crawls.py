"""How the shapes benchmark runs each crawler on a shape, on a fresh site per run.

Uncapped shapes run to completion; the skewed shape is watched through the site's log and
the crawler stopped once the small hosts are done; a one-off small crawl times crawlfleet's
start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.crawl_bench import TreeMemorySampler, crawlfleet_argv, crawlfleet_env, run_crawlfleet
from bench.peers import (
    REPO_ROOT,
    PeerResult,
    bare_args,
    peer_command,
    peer_env,
    run_bare_aiohttp,
    run_scrapy,
)
from bench.polite_peers import scrapy_polite_settings
from bench.proc_costs import RoleCost
from bench.proc_group import end_group, popen_reaper
from bench.shapes_referee import DEFERRED, Robots, referee
from bench.shapes_report import print_tail
from bench.shapes_runs import FirstRequest, ShapeRun, SkewedRun
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite
from sites.shapes import SkewedSite
from sites.site_spec import SiteSpec, canonical_url


def run_uncapped(
    shape: str,
    crawler: str,
    spec: SiteSpec,
    expected: Mapping[str, int],
    robots: Robots,
    fn: Callable[[], PeerResult | tuple[PeerResult, TreeMemorySampler]],
    summary: dict[str, Any] | None = None,
) -> ShapeRun:
    result: PeerResult | None = None
    error = None
    costs: dict[str, RoleCost] = {}
    with DemoSite(spec) as site:
        try:
            out = fn()
            if isinstance(out, tuple):
                result, costs = out[0], out[1].costs.by_role()
            else:
                result = out
        except RuntimeError as exc:
            error = str(exc)
        log = site.log_with_statuses()
    return ShapeRun(shape, crawler, referee(spec, expected, log, robots), result, error,
                    costs=costs, summary=dict(summary or {}))


class SmallHostWatch:
    """Follows the site's log until every small host's expected pages have been answered."""

    def __init__(self, spec: SkewedSite, expected: Mapping[str, int]) -> None:
        self.spec = spec
        small = tuple(spec.url(h, "/") for h in spec.small_hosts)
        self.small_expected = {u for u in expected if u.startswith(small)}
        self.pending = set(self.small_expected)
        self.seen = 0
        self.first_at: float | None = None
        self.done_at: float | None = None

    def poll(self, site: DemoSite) -> bool:
        """Read the log's new entries; True once every small-host page was answered."""
        entries = site.log_with_statuses(self.seen)
        self.seen += len(entries)
        for t, host, raw, status in entries:
            if self.first_at is None:
                self.first_at = t
            if self.done_at is not None or host == self.spec.big_host or status in DEFERRED:
                continue
            self.pending.discard(canonical_url(self.spec.url(host, raw)))
            if not self.pending:
                self.done_at = t
        return self.done_at is not None


def _small_bound(spec: SkewedSite, expected: Mapping[str, int]) -> float:
    """The small hosts' own bound: a host's least requests (its pages and robots.txt) at the
    cap, the slowest host's. Requests paced exactly 1/cap apart need (n - 1)/cap, so a
    perfect crawler scores just under 1x (~0.95 for 21 requests)."""
    per_host = Counter(u.split("/")[2].split(":")[0] for u in expected)
    return max((per_host[h] + 1) / spec.cap for h in spec.small_hosts)


def _watch(
    site: DemoSite,
    watch: SmallHostWatch,
    alive: Callable[[], bool],
    timeout_s: float,
) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        if watch.poll(site):
            return "done"
        if not alive():
            watch.poll(site)
            return "done" if watch.done_at is not None else "exited"
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.1)


def _skewed_result(
    crawler: str,
    spec: SkewedSite,
    expected: Mapping[str, int],
    robots: Robots,
    site: DemoSite,
    watch: SmallHostWatch,
    stopped: str,
    started: float,
    process_s: float,
    peak_rss_mb: float,
) -> SkewedRun:
    log = site.log_with_statuses()
    cutoff = watch.done_at if watch.done_at is not None else (log[-1][0] if log else 0.0)
    ref = referee(spec, expected, log, robots)
    return SkewedRun(
        crawler=crawler,
        stopped=stopped,
        completion_s=(
            watch.done_at - watch.first_at
            if watch.done_at is not None and watch.first_at is not None
            else None
        ),
        bound_s=_small_bound(spec, expected),
        small_served=len(watch.small_expected) - len(watch.pending),
        small_expected=len(watch.small_expected),
        violations=site.violations(),
        limited=sum(site.rate_limited.values()),
        big_requests=sum(1 for t, h, _, _ in log if h == spec.big_host and t <= cutoff),
        refetched=ref.refetched,
        disallowed=ref.disallowed,
        first_request_s=watch.first_at - started if watch.first_at is not None else None,
        process_s=process_s,
        peak_rss_mb=peak_rss_mb,
    )


def run_peer_skewed(
    kind: str,
    name: str,
    extra: list[str],
    spec: SkewedSite,
    expected: Mapping[str, int],
    robots: Robots,
    concurrency: int,
    timeout_s: float,
) -> SkewedRun:
    """A peer child on the skewed shape, stopped once the small hosts are done."""
    watch = SmallHostWatch(spec, expected)
    usage: list[Any] = []  # the child's rusage, once reaped
    codes: list[int] = []

    with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as tmp, DemoSite(
        spec, rate_cap=spec.cap
    ) as site:
        seeds = Path(tmp, "seeds.txt")
        seeds.write_text("\n".join(spec.seeds()) + "\n")
        cmd = peer_command(kind, seeds, spec.hosts, concurrency, Path(tmp, "out.json"), extra)
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=peer_env(), start_new_session=True)

        def reap(wait_s: float) -> bool:
            """Reap the child with its rusage (its own peak RSS) if it has ended."""
            if usage:
                return True
            deadline = time.monotonic() + wait_s
            while True:
                pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    usage.append(ru)
                    codes.append(os.waitstatus_to_exitcode(status))
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)

        stopped = _watch(site, watch, lambda: not reap(0.0), timeout_s)
        if stopped == "exited":
            stopped = f"exited ({codes[0]})"
        if not usage:
            end_group(proc.pid, reap, grace_s=5.0)
        process_s = time.monotonic() - started
        # reaped through os.wait4, which Popen does not know of
        proc.returncode = codes[0] if codes else -9
        peak = usage[0].ru_maxrss / 1024 if usage else 0.0  # KiB on Linux
        return _skewed_result(
            name, spec, expected, robots, site, watch, stopped, started, process_s, peak
        )


def _delete_leftover_topics(data_dir: Path, console: Console) -> None:
    """Delete the topics of a crawl that was stopped before it could delete its own.

    A crawl's per-run prefix is the name of its log directory; best effort (a broker that
    keeps every stopped crawl's partitions only gets slower).
    """
    logs = data_dir / "logs"
    prefixes = [d.name + "." for d in logs.iterdir() if d.is_dir()] if logs.is_dir() else []
    for prefix in prefixes:
        try:
            from core.config import load_settings
            from crawlfleet.reach import resolve_bootstrap
            from infra.topics import delete_topics

            settings = load_settings(None, topic_prefix=prefix)
            delete_topics(resolve_bootstrap(settings, start_local=False))
        except Exception as exc:  # cleanup only: never fail the benchmark for it
            console.print(f"[yellow]topics of {prefix} not deleted: {exc}[/]")


def run_crawlfleet_skewed(
    command: list[str],
    spec: SkewedSite,
    expected: Mapping[str, int],
    robots: Robots,
    concurrency: int,
    timeout_s: float,
    extra_args: list[str],
    console: Console,
    output: Path,
) -> SkewedRun:
    """``crawlfleet crawl`` on the skewed shape; it cannot drain, so the bench stops it.

    Its progress goes to ``output``."""
    watch = SmallHostWatch(spec, expected)
    with tempfile.TemporaryDirectory(prefix="bench-crawlfleet-") as tmp, DemoSite(
        spec, rate_cap=spec.cap
    ) as site:
        seeds, data = Path(tmp, "seeds.txt"), Path(tmp, "data")
        seeds.write_text("\n".join(spec.seeds()) + "\n")
        args = ["--rate-cap", f"{spec.cap:g}", *extra_args]
        argv = crawlfleet_argv(command, seeds, Path(tmp, "summary.json"), data, args)
        with output.open("ab") as out:
            started = time.monotonic()
            proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=crawlfleet_env(concurrency),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            sampler = TreeMemorySampler(proc.pid)
            sampler.start()
            try:
                stopped = _watch(site, watch, lambda: proc.poll() is None, timeout_s)
            finally:
                sampler.stop()

            end_group(proc.pid, popen_reaper(proc), grace_s=30.0)
            process_s = time.monotonic() - started
        if stopped == "exited":
            stopped = f"exited ({proc.returncode})"
        if stopped != "done":
            print_tail(console, output)
        result = _skewed_result(
            "crawlfleet",
            spec,
            expected,
            robots,
            site,
            watch,
            stopped,
            started,
            process_s,
            sampler.peak_rss / 2**20,
        )
        _delete_leftover_topics(data, console)
    return result


def time_first_request(
    command: list[str], port: int, concurrency: int, timeout_s: float = 120.0
) -> FirstRequest:
    """Time a one-off ``crawlfleet crawl`` of 200 pages from its process start to the site's
    first request: what a user waits before anything happens (topics, stage processes,
    consumer groups, seeds), the broker's own start-up excluded."""
    spec = bench_spec(port, 200, 2, 6_000)
    with tempfile.TemporaryDirectory(prefix="bench-crawlfleet-") as tmp, DemoSite(spec) as site:
        seeds, summary = Path(tmp, "seeds.txt"), Path(tmp, "summary.json")
        seeds.write_text("\n".join(spec.seeds()) + "\n")
        argv = crawlfleet_argv(command, seeds, summary, Path(tmp, "data"), [])
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=crawlfleet_env(concurrency),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            end_group(proc.pid, popen_reaper(proc), 30.0)
            code = None
        process_s = time.monotonic() - started
        log = site.snapshot()[1]
        pages = int(json.loads(summary.read_text())["pages_stored"]) if summary.exists() else 0
    return FirstRequest(
        seconds=log[0][0] - started if log else None,
        process_s=process_s,
        pages=pages,
        expected=len(spec.expected()),
        exit_code=code,
    )


def uncapped_runner(
    crawler: str,
    spec: SiteSpec,
    args: argparse.Namespace,
    command: list[str] | None,
    output: Path,
    summary_sink: dict[str, Any] | None = None,
) -> Callable[[], PeerResult | tuple[PeerResult, TreeMemorySampler]]:
    """How ``crawler`` crawls an uncapped shape: as ``bench.crawl_bench`` runs it
    (crawlfleet's progress goes to ``output``, not the terminal)."""
    seeds, hosts, conc = spec.seeds(), list(spec.hosts), args.concurrency
    if crawler == "bare-aiohttp":
        return lambda: run_bare_aiohttp(seeds, hosts, conc)
    if crawler == "scrapy":
        return lambda: run_scrapy(seeds, hosts, conc, timeout=args.timeout)
    assert command is not None
    cmd = command
    # crawlfleet's own --timeout ends a crawl that cannot drain with a summary of it
    extra = ["--timeout", f"{args.timeout:g}", *args.crawlfleet_arg]
    return lambda: run_crawlfleet(cmd, spec, extra, args.timeout + 120, conc, output,
                                  summary_sink)


def run_skewed(
    crawler: str,
    spec: SkewedSite,
    expected: Mapping[str, int],
    robots: Robots,
    args: argparse.Namespace,
    command: list[str] | None,
    console: Console,
    output: Path,
) -> SkewedRun:
    conc, timeout = args.concurrency, args.skewed_timeout
    if crawler == "bare-aiohttp":
        extra = bare_args(1.0 / spec.cap)
        return run_peer_skewed("bare", crawler, extra, spec, expected, robots, conc, timeout)
    if crawler == "scrapy":
        settings = scrapy_polite_settings(spec.cap, conc)
        extra = ["--settings-json", json.dumps(settings), "--name", "scrapy (polite)"]
        return run_peer_skewed("scrapy", crawler, extra, spec, expected, robots, conc, timeout)
    assert command is not None
    return run_crawlfleet_skewed(
        command, spec, expected, robots, conc, timeout, list(args.crawlfleet_arg), console, output
    )
