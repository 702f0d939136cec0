"""The shapes benchmark's tables and one-line summaries, printed with rich.

Pure formatting of the run records (``bench.shapes_runs``) and of crawlfleet's own summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.proc_costs import PARTS
from bench.shapes_runs import CRAWLERS, SKEWED, TARGET_RATIO, ShapeRun, SkewedRun
from sites.shapes import SkewedSite
from sites.site_spec import SiteSpec


def print_tail(console: Console, path: Path, lines: int = 25) -> None:
    if path.exists():
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        console.print(f"[yellow]{path}, last lines:[/]")
        console.print("\n".join(tail), markup=False, highlight=False)


def _yes(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"


def shape_table(shape: str, spec: SiteSpec, runs: list[ShapeRun], repeat: int) -> Table:
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


def costs_table(shape: str, run: ShapeRun) -> Table:
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


def skewed_table(spec: SkewedSite, runs: list[SkewedRun], timeout_s: float) -> Table:
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


def summary_table(by_shape: dict[str, dict[str, ShapeRun]]) -> Table:
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
