"""Shapes benchmark: crawlfleet, Scrapy and the bare aiohttp loop on several site shapes, one run.

    python -m bench.shapes_bench [--shapes few-large,mixed-50,deep-chain,skewed-polite]
                                 [--repeat 1] [--pages-scale 1.0] [--concurrency 64] [--port N]
                                 [--timeout 900] [--skewed-timeout 180] [--warmup-pages 2000]
                                 [--skip-crawlfleet] [--skip-scrapy] [--skip-bare]
                                 [--json-out bench/out/shapes_bench.json] [--log-dir DIR]

One site shape says little about a crawler: a throughput figure from eight equal hosts hides
what few hosts, many failing hosts, a deep chain or one huge host beside small ones do to it.
Each shape (``sites.demo_site.shape_spec``) gets a fresh server per run, in a thread of this
process; every crawler runs as its own subprocess at the same concurrency, in interleaved
rounds as in ``bench.crawl_bench``. The site's request log is the referee: every expected
page answered exactly once with its final status (a 503 or 429 is a deferral, asked again),
nothing robots.txt disallows requested, and the crawler's own page count equal to the site's.

* Uncapped shapes (few-large, mixed-50, deep-chain): crawlfleet with default settings apart
  from ``--rate-cap 100000``; peers as in ``bench.crawl_bench``. Pages/s is each crawler's own
  figure (first request to last response, or to the last page stored for crawlfleet).
* skewed-polite: every host capped at 2 requests/s by the site (over the cap: 429 and a
  violation) and by each crawler (crawlfleet ``--rate-cap 2``; Scrapy ``DOWNLOAD_DELAY 0.5``,
  one request per host at a time, no jitter; the bare loop 0.5 s apart per host). The big
  host's 20,000 URLs are seeded before the small hosts' homes and would take hours, so the
  bench watches the log and stops the crawler (SIGTERM to its process group) as soon as every
  small host's pages have been answered, or marks it incomplete after ``--skewed-timeout``.
  The small hosts' bound is their own work at the cap: (pages + robots.txt) / cap, ~10.5 s.
  A run meets the target at <= 1.5x the bound with 0 violations and 0 429s.

crawlfleet first gets an uncounted warm-up crawl (which starts the local broker if none
runs), then one small crawl times ``crawlfleet crawl``'s start-up: process start to the site's
first request, with the broker already up.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from protego import Protego
from rich.console import Console
from rich.table import Table

from bench.crawl_bench import (
    TreeMemorySampler,
    add_crawler_args,
    crawlfleet_argv,
    crawlfleet_command,
    crawlfleet_env,
    run_crawlfleet,
)
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
from bench.proc_costs import PARTS, RoleCost
from infra import kafka_local
from sites.demo_site import (
    SHAPES,
    USER_AGENT,
    DemoSite,
    SiteSpec,
    SkewedSite,
    bench_spec,
    canonical_url,
    free_port,
    shape_spec,
)

CRAWLERS = ("bare-aiohttp", "scrapy", "crawlfleet")
SKEWED = "skewed-polite"
TARGET_RATIO = 1.5  # small hosts' completion time / their bound
TARGET_FIRST_REQUEST_S = 3.0
DEFERRED = (429, 503)  # answers that tell a crawler to ask again, not pages

LogEntry = tuple[float, str, str, int]  # (monotonic time, host, path?query, status)


# -- the referee -----------------------------------------------------------------------------------


class _Robots:
    """robots.txt verdicts of the site, per host, as the expectation applies them."""

    def __init__(self, spec: SiteSpec) -> None:
        self._parsers = {
            h: Protego.parse(r) for h in spec.hosts if (r := spec.robots_txt(h)) is not None
        }

    def disallows(self, host: str, url: str) -> bool:
        rp = self._parsers.get(host)
        return rp is not None and not rp.can_fetch(url, USER_AGENT)


@dataclass
class Referee:
    """What the site's log says about one crawl."""

    expected: int
    served: int  # distinct expected URLs answered with a final status
    refetched: int  # final answers beyond the first for the same URL
    unexpected: int  # final answers for URLs outside the expected set
    disallowed: int  # requests for URLs robots.txt disallows
    deferred: int  # 429/503 answers (the crawler must ask again)
    robots: int
    requests: int
    window_s: float  # the site's first request to its last

    @property
    def exact(self) -> bool:
        return (
            self.served == self.expected
            and self.refetched == 0
            and self.unexpected == 0
            and self.disallowed == 0
        )


def referee(
    spec: SiteSpec,
    expected: Mapping[str, int] | set[str],
    log: Sequence[LogEntry],
    robots: _Robots | None = None,
) -> Referee:
    """Check a crawl's requests against the URLs a correct crawler fetches, once each."""
    robots = robots or _Robots(spec)
    finals: Counter[str] = Counter()
    n_robots = deferred = disallowed = 0
    for _, host, raw, status in log:
        if raw.partition("?")[0] == "/robots.txt":
            n_robots += 1
            continue
        url = canonical_url(spec.url(host, raw))
        if robots.disallows(host, url):
            disallowed += 1
        if status in DEFERRED:
            deferred += 1
        else:
            finals[url] += 1
    return Referee(
        expected=len(expected),
        served=sum(1 for u in finals if u in expected),
        refetched=sum(n - 1 for n in finals.values()),
        unexpected=sum(1 for u in finals if u not in expected),
        disallowed=disallowed,
        deferred=deferred,
        robots=n_robots,
        requests=len(log),
        window_s=log[-1][0] - log[0][0] if log else 0.0,
    )


# -- uncapped shapes -------------------------------------------------------------------------------


@dataclass
class ShapeRun:
    """One crawler's run on an uncapped shape: its own figures and the referee's."""

    shape: str
    crawler: str
    ref: Referee
    result: PeerResult | None
    error: str | None = None
    all_pages_per_s: list[float] = field(default_factory=list)
    every_run_exact: bool = True
    costs: dict[str, RoleCost] = field(default_factory=dict)  # crawlfleet: by process role
    summary: dict[str, Any] = field(default_factory=dict)  # crawlfleet: its summary JSON

    @property
    def cpu_ms_per_page(self) -> float | None:
        res = self.result
        return 1000 * res.cpu_s / res.pages if res is not None and res.pages else None

    @property
    def pages_per_s(self) -> float:
        return self.result.pages_per_s if self.result is not None else 0.0

    @property
    def exact(self) -> bool:
        return (
            self.result is not None
            and self.error is None
            and self.result.pages == self.ref.expected
            and self.ref.exact
        )

    @property
    def complete(self) -> bool:
        return self.exact and self.every_run_exact


def _median_shape_run(runs: list[ShapeRun]) -> ShapeRun:
    ranked = sorted(runs, key=lambda r: r.pages_per_s)
    chosen = ranked[(len(ranked) - 1) // 2]
    chosen.all_pages_per_s = [r.pages_per_s for r in runs]
    chosen.every_run_exact = all(r.exact for r in runs)
    return chosen


def _run_uncapped(
    shape: str,
    crawler: str,
    spec: SiteSpec,
    expected: Mapping[str, int],
    robots: _Robots,
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


# -- the skewed shape ------------------------------------------------------------------------------


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


@dataclass
class SkewedRun:
    """One crawler's run on the skewed shape, from the site's side."""

    crawler: str
    stopped: str  # "done", "timeout" or "exited (<code>)"
    completion_s: float | None  # its first request to the last small-host page answered
    bound_s: float  # max over small hosts of (expected pages + robots.txt) / cap
    small_served: int
    small_expected: int
    violations: int
    limited: int  # 429 answers
    big_requests: int  # big-host requests up to completion (or the stop)
    refetched: int
    disallowed: int
    first_request_s: float | None  # process start to the site's first request
    process_s: float
    peak_rss_mb: float

    @property
    def complete(self) -> bool:
        return self.completion_s is not None

    @property
    def ratio(self) -> float | None:
        return self.completion_s / self.bound_s if self.completion_s is not None else None

    @property
    def meets_target(self) -> bool:
        return (
            self.ratio is not None
            and self.ratio <= TARGET_RATIO
            and self.violations == 0
            and self.limited == 0
            and self.refetched == 0
            and self.disallowed == 0
        )


def _median_skewed_run(runs: list[SkewedRun]) -> SkewedRun:
    ranked = sorted(runs, key=lambda r: r.completion_s if r.completion_s is not None else 1e18)
    return ranked[(len(ranked) - 1) // 2]


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


def _end_group(pgid: int, reap: Callable[[float], bool], grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL it if anything outlives ``grace_s``; reap the
    leader (``reap(wait_s)`` is True once it is reaped)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap(0.1)
            if not _group_alive(pgid):
                break
        if not _group_alive(pgid):
            break
    reap(30.0)


def _popen_reaper(proc: subprocess.Popen[bytes]) -> Callable[[float], bool]:
    def reap(wait_s: float) -> bool:
        try:
            proc.wait(timeout=wait_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    return reap


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in group ``pgid``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _skewed_result(
    crawler: str,
    spec: SkewedSite,
    expected: Mapping[str, int],
    robots: _Robots,
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
    robots: _Robots,
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
            _end_group(proc.pid, reap, grace_s=5.0)
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
    robots: _Robots,
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

            _end_group(proc.pid, _popen_reaper(proc), grace_s=30.0)
            process_s = time.monotonic() - started
        if stopped == "exited":
            stopped = f"exited ({proc.returncode})"
        if stopped != "done":
            _print_tail(console, output)
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


# -- crawlfleet start-up ---------------------------------------------------------------------------


@dataclass
class FirstRequest:
    """``crawlfleet crawl``'s start-up on a small site, broker already running."""

    seconds: float | None  # process start to the site's first request
    process_s: float
    pages: int
    expected: int
    exit_code: int | None


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
            _end_group(proc.pid, _popen_reaper(proc), 30.0)
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


# -- reporting -------------------------------------------------------------------------------------


def _print_tail(console: Console, path: Path, lines: int = 25) -> None:
    if path.exists():
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        console.print(f"[yellow]{path}, last lines:[/]")
        console.print("\n".join(tail), markup=False, highlight=False)


def _yes(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"


def _shape_table(shape: str, spec: SiteSpec, runs: list[ShapeRun], repeat: int) -> Table:
    table = Table(
        title=f"{shape}: {len(spec.hosts)} hosts, {runs[0].ref.expected} pages expected, "
        f"median of {repeat} run(s)"
    )
    table.add_column("crawler", no_wrap=True)
    for col in (
        "pages",
        "served",
        "exact",
        "seconds",
        "pages/s",
        "peak RSS MB",
        "process s",
        "CPU s",
        "CPU ms/page",
        "requests",
        "429/503",
        "refetched",
        "unexpected",
        "disallowed",
        "pages/s of every run",
    ):
        table.add_column(col, justify="right")
    for r in runs:
        res = r.result
        table.add_row(
            res.name if res is not None else f"{r.crawler} (failed)",
            str(res.pages) if res else "-",
            f"{r.ref.served}/{r.ref.expected}",
            _yes(r.complete),
            f"{res.seconds:.2f}" if res else "-",
            f"{res.pages_per_s:,.0f}" if res else "-",
            f"{res.peak_rss_mb:,.0f}" if res else "-",
            f"{res.process_seconds:.1f}" if res else "-",
            f"{res.cpu_s:.1f}" if res else "-",
            f"{r.cpu_ms_per_page:.2f}" if r.cpu_ms_per_page is not None else "-",
            str(r.ref.requests),
            str(r.ref.deferred),
            str(r.ref.refetched),
            str(r.ref.unexpected),
            str(r.ref.disallowed),
            ", ".join(f"{v:,.0f}" for v in r.all_pages_per_s) or "-",
        )
    return table


def crawlfleet_timeline(summary: Mapping[str, Any]) -> str:
    """One line of a crawl's summary: time outside crawling (start-up: command start to
    first fetch; drain: last store to drained; teardown: drained to exit) and link hops."""
    ph = summary.get("phases") or {}
    parts = []
    if {"first_fetch", "last_store", "drained", "ended"} <= set(ph):
        start, drain = ph["first_fetch"], ph["drained"] - ph["last_store"]
        down = ph["ended"] - ph["drained"]
        parts.append(f"outside crawling {start + drain + down:.2f} s (start-up to first "
                     f"fetch {start:.2f}, drain {drain:.2f}, teardown {down:.2f})")
    hop = summary.get("hop_ms") or {}
    if hop:
        parts.append(f"link hop p50/p90/p99 {hop['p50']:.0f}/{hop['p90']:.0f}/"
                     f"{hop['p99']:.0f} ms over {hop['n']:.0f} links")
    return "; ".join(parts) or "(no timeline in its summary)"


def pss_make_up(parts_mb: dict[str, float]) -> str:
    """A role's peak PSS by what holds it (:data:`bench.proc_costs.PARTS`), as one cell."""
    if not parts_mb:
        return "-"
    return " / ".join(f"{parts_mb.get(part, 0.0):,.0f}" for part in PARTS)


def _costs_table(shape: str, run: ShapeRun) -> Table:
    """crawlfleet's processes on one shape: CPU per 1,000 stored pages and peak PSS, by role
    (sampled from /proc; the total row is the exact figure: reaped children + the broker)."""
    res = run.result
    pages = max(1, res.pages if res is not None else 0)
    table = Table(title=f"{shape}: crawlfleet by process ({pages} pages stored)")
    table.add_column("process", no_wrap=True)
    for col in ("processes", "CPU s", "CPU s / 1,000 pages", "share", "peak PSS MB"):
        table.add_column(col, justify="right")
    table.add_column("of it: chDB lib / code / anon / files MB", justify="right")
    sampled = sum(c.cpu_s for c in run.costs.values()) or 1.0
    for role, c in sorted(run.costs.items(), key=lambda kv: -kv[1].cpu_s):
        table.add_row(role, str(c.processes), f"{c.cpu_s:.2f}",
                      f"{1000 * c.cpu_s / pages:.2f}", f"{c.cpu_s / sampled:.0%}",
                      f"{c.peak_pss_mb:,.0f}" if role != "broker" else
                      f"({c.peak_pss_mb:,.0f})", pss_make_up(c.pss_parts_mb))
    stages = sum(c.peak_pss_mb for r, c in run.costs.items() if r != "broker")
    if res is not None:
        table.add_row("total (exact)", "", f"{res.cpu_s:.2f}", f"{1000 * res.cpu_s / pages:.2f}",
                      "", f"{stages:,.0f} (broker apart)")
    return table


def _skewed_table(spec: SkewedSite, runs: list[SkewedRun], timeout_s: float) -> Table:
    table = Table(
        title=f"{SKEWED}: 1 host x {spec.pages_per_host[0]} pages (seeded first) + "
        f"{len(spec.small_hosts)} hosts x {spec.pages_per_host[1]}, cap {spec.cap:g} req/s; "
        f"small hosts' bound {runs[0].bound_s:.1f} s, target <= {TARGET_RATIO}x, "
        f"0 violations, 0 429s"
    )
    table.add_column("crawler", no_wrap=True)
    for col in (
        "small-host pages",
        "small done s",
        "x bound",
        "violations",
        "429s",
        "big-host req",
        "refetched",
        "disallowed",
        "stopped",
        "1st request s",
        "peak RSS MB",
        "target",
    ):
        table.add_column(col, justify="right")
    for r in runs:
        ratio_style = "green" if r.ratio is not None and r.ratio <= TARGET_RATIO else "red"
        table.add_row(
            r.crawler,
            f"{r.small_served}/{r.small_expected}",
            f"{r.completion_s:.1f}" if r.completion_s is not None else f"> {timeout_s:.0f}",
            f"[{ratio_style}]{r.ratio:.2f}[/]" if r.ratio is not None else "[red]-[/]",
            f"[{'green' if r.violations == 0 else 'red'}]{r.violations}[/]",
            f"[{'green' if r.limited == 0 else 'red'}]{r.limited}[/]",
            str(r.big_requests),
            str(r.refetched),
            str(r.disallowed),
            r.stopped,
            f"{r.first_request_s:.1f}" if r.first_request_s is not None else "-",
            f"{r.peak_rss_mb:,.0f}",
            "[green]met[/]" if r.meets_target else "[red]missed[/]",
        )
    return table


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _summary_table(by_shape: dict[str, dict[str, ShapeRun]]) -> Table:
    table = Table(title="summary: pages/s (median run) and peak RSS MB per crawler and shape")
    table.add_column("shape", no_wrap=True)
    for col in (
        "bare p/s",
        "Scrapy p/s",
        "crawlfleet p/s",
        "cf / Scrapy",
        "cf / bare",
        "bare RSS",
        "Scrapy RSS",
        "cf RSS",
        "exact (b/S/cf)",
    ):
        table.add_column(col, justify="right")
    for shape, runs in by_shape.items():
        bare, scrapy, fleet = (runs.get(c) for c in CRAWLERS)

        def pps(r: ShapeRun | None) -> float:
            return r.pages_per_s if r is not None else 0.0

        def rss(r: ShapeRun | None) -> str:
            return f"{r.result.peak_rss_mb:,.0f}" if r and r.result else "-"

        def ok(r: ShapeRun | None) -> str:
            return "-" if r is None else ("[green]y[/]" if r.complete else "[red]N[/]")

        table.add_row(
            shape,
            f"{pps(bare):,.0f}" if bare else "-",
            f"{pps(scrapy):,.0f}" if scrapy else "-",
            f"{pps(fleet):,.0f}" if fleet else "-",
            _ratio(pps(fleet), pps(scrapy)),
            _ratio(pps(fleet), pps(bare)),
            rss(bare),
            rss(scrapy),
            rss(fleet),
            "/".join(ok(r) for r in (bare, scrapy, fleet)),
        )
    return table


# -- driver ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per crawler and shape")
    parser.add_argument(
        "--pages-scale", type=float, default=1.0, help="multiply every shape's page counts"
    )
    parser.add_argument("--page-bytes", type=int, default=12_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--port", type=int, help="site port (default: first free from 18700)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per uncapped crawl, s")
    parser.add_argument(
        "--skewed-timeout", type=float, default=180.0, help="skewed shape: give up after s"
    )
    parser.add_argument(
        "--warmup-pages", type=int, default=2000, help="crawlfleet's uncounted warm-up (0: none)"
    )
    add_crawler_args(parser)
    parser.add_argument(
        "--cold", action="store_true",
        help="stop the local broker before each crawlfleet crawl, so its command starts it "
        "(the cold figure; with --warmup-pages 0 nothing warms it before)")
    parser.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--log-dir", type=Path, help="crawlfleet's output (default: a temp dir)")
    args = parser.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    repeat = max(1, args.repeat)
    conc = args.concurrency
    console = Console(width=None if sys.stdout.isatty() else 170)

    command = None
    if not args.skip_crawlfleet:
        command = crawlfleet_command(args.crawlfleet_cmd)
        if command is None:
            console.print("[red]crawlfleet command not found[/]; pass --crawlfleet-cmd")
            return 2
    crawlers = [
        c
        for c, skip in zip(
            CRAWLERS, (args.skip_bare, args.skip_scrapy, command is None), strict=True
        )
        if not skip
    ]

    specs = {s: shape_spec(s, 0, args.pages_scale, args.page_bytes) for s in shapes}
    all_hosts = sorted({h for spec in specs.values() for h in spec.hosts})
    port = args.port if args.port is not None else free_port(all_hosts, start=18700)
    specs = {s: shape_spec(s, port, args.pages_scale, args.page_bytes) for s in shapes}
    console.print(
        f"shapes: {', '.join(shapes)} (scale {args.pages_scale:g}) on port {port}; "
        f"crawlers: {', '.join(crawlers)}; concurrency {conc}; {repeat} run(s) each; "
        f"server in-process thread, crawlers in subprocesses; {os.cpu_count()} CPUs"
    )

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="shapes-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    console.print(f"crawlfleet's own output goes to {log_dir}")
    failures = 0
    first: FirstRequest | None = None
    if command is not None:
        if args.warmup_pages > 0:
            wspec = bench_spec(port, args.warmup_pages, 8)
            console.print(f"warm-up: crawlfleet on {args.warmup_pages} pages (not counted) ...")
            try:
                with DemoSite(wspec):
                    warm, _ = run_crawlfleet(
                        command, wspec, args.crawlfleet_arg, 600.0, conc, log_dir / "warm-up.log"
                    )
                console.print(f"  warm-up: {warm.pages} pages, {warm.pages_per_s:,.0f} pages/s")
            except RuntimeError as exc:
                console.print(f"[yellow]warm-up failed:[/] {exc}")
        console.print("crawlfleet start-up: a one-off crawl of 200 pages ...")
        first = time_first_request(command, port, conc)
        secs = f"{first.seconds:.2f} s" if first.seconds is not None else "never"
        console.print(f"  first request after {secs}, process {first.process_s:.1f} s")

    by_shape: dict[str, dict[str, ShapeRun]] = {}
    skewed_runs: list[SkewedRun] = []
    every_run: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for shape in shapes:
        spec = specs[shape]
        expected = spec.expected()
        robots = _Robots(spec)
        console.rule(f"{shape}: {len(spec.hosts)} hosts, {len(expected)} pages expected")
        runs: dict[str, list[ShapeRun]] = {c: [] for c in crawlers}
        skewed: dict[str, list[SkewedRun]] = {c: [] for c in crawlers}
        for round_no in range(1, repeat + 1):
            for crawler in crawlers:
                console.print(f"round {round_no}/{repeat}: {crawler} ...")
                output = log_dir / f"{shape}-{crawler}-{round_no}.log"
                if isinstance(spec, SkewedSite):
                    s = _run_skewed(
                        crawler, spec, expected, robots, args, command, console, output
                    )
                    skewed[crawler].append(s)
                    done = f"{s.completion_s:.1f} s" if s.completion_s is not None else "not done"
                    console.print(
                        f"  small hosts {s.small_served}/{s.small_expected}: {done} "
                        f"(bound {s.bound_s:.1f} s), {s.violations} violations, "
                        f"{s.limited} 429s, {s.big_requests} big-host requests; {s.stopped}"
                    )
                    continue
                if args.cold and crawler == "crawlfleet":
                    kafka_local.down()  # the crawl finds no broker and starts its own
                sink: dict[str, Any] = {}
                fn = _uncapped_runner(crawler, spec, args, command, output, sink)
                r = _run_uncapped(shape, crawler, spec, expected, robots, fn, sink)
                runs[crawler].append(r)
                if r.error is not None:
                    failures += 1
                    console.print(f"  [red]failed:[/] {r.error}")
                if crawler == "crawlfleet" and not r.exact:
                    _print_tail(console, output)
                if crawler == "crawlfleet" and r.summary:
                    console.print(f"  {crawlfleet_timeline(r.summary)}")
                res = r.result
                if res is not None:
                    console.print(
                        f"  {res.pages} pages in {res.seconds:.2f} s = {res.pages_per_s:,.0f} "
                        f"pages/s, peak RSS {res.peak_rss_mb:,.0f} MB; site: "
                        f"{r.ref.served}/{r.ref.expected} served, {r.ref.refetched} refetched, "
                        f"{r.ref.disallowed} disallowed"
                    )
        if isinstance(spec, SkewedSite):
            medians = [_median_skewed_run(rs) for rs in skewed.values() if rs]
            skewed_runs.extend(medians)
            if medians:
                console.print(_skewed_table(spec, medians, args.skewed_timeout))
            every_run[shape] = {c: [asdict(x) for x in rs] for c, rs in skewed.items()}
        else:
            by_shape[shape] = {c: _median_shape_run(rs) for c, rs in runs.items() if rs}
            if by_shape[shape]:
                console.print(_shape_table(shape, spec, list(by_shape[shape].values()), repeat))
                fleet = by_shape[shape].get("crawlfleet")
                if fleet is not None and fleet.costs:
                    console.print(_costs_table(shape, fleet))
            every_run[shape] = {
                c: [{**asdict(x), "exact": x.exact} for x in rs] for c, rs in runs.items()
            }

    console.rule("summary")
    if by_shape:
        console.print(_summary_table(by_shape))
    skewed_spec = specs.get(SKEWED)
    if skewed_runs and isinstance(skewed_spec, SkewedSite):
        console.print(_skewed_table(skewed_spec, skewed_runs, args.skewed_timeout))
    if first is not None:
        ok = first.seconds is not None and first.seconds <= TARGET_FIRST_REQUEST_S
        secs = f"{first.seconds:.2f} s" if first.seconds is not None else "never"
        verdict = "[green]met[/]" if ok else "[red]missed[/]"
        console.print(
            f"crawlfleet crawl, process start to first request: {secs} "
            f"(target <= {TARGET_FIRST_REQUEST_S:g} s: {verdict}); "
            f"{first.pages}/{first.expected} pages in {first.process_s:.1f} s of process"
        )
    inexact = [f"{s}/{c}" for s, rs in by_shape.items() for c, r in rs.items() if not r.complete]
    if inexact:
        console.print(f"[yellow]did not crawl exactly: {', '.join(inexact)}[/]")

    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "port": port,
            "cpus": os.cpu_count(),
            "first_request": asdict(first) if first is not None else None,
            "shapes": {
                s: {c: {**asdict(r), "complete": r.complete} for c, r in rs.items()}
                for s, rs in by_shape.items()
            },
            "skewed": [
                {**asdict(r), "ratio": r.ratio, "meets_target": r.meets_target}
                for r in skewed_runs
            ],
            "every_run": every_run,
        }
        args.json_out.write_text(json.dumps(payload, indent=2))
    return 1 if failures else 0


def _uncapped_runner(
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


def _run_skewed(
    crawler: str,
    spec: SkewedSite,
    expected: Mapping[str, int],
    robots: _Robots,
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


if __name__ == "__main__":
    sys.exit(main())
