"""The politeness benchmark's tables, printed with rich: summary, joins and per-host timing."""

from __future__ import annotations

from rich.table import Table

from bench.polite_analysis import TARGET_EFFICIENCY, TARGET_PUBLISH_RATIO, Politeness


def summary_table(runs: list[Politeness], title: str) -> Table:
    table = Table(title=title)
    table.add_column("crawler", no_wrap=True)
    for col in (
        "pages",
        "served/expected",
        "exact",
        "page req",
        "robots",
        "window s",
        "pages/s",
        "efficiency",
        "violations",
        "max/1s (limit)",
        "process s",
        "RSS MB",
    ):
        table.add_column(col, justify="right")
    for r in runs:
        eff_style = "green" if r.efficiency >= TARGET_EFFICIENCY else "yellow"
        viol_style = "green" if r.violations == 0 else "red"
        table.add_row(
            r.name,
            str(r.reported_pages),
            f"{r.fetched_expected}/{r.expected}",
            "[green]yes[/]" if r.exact else "[red]NO[/]",
            str(r.page_requests),
            str(r.robots_requests),
            f"{r.window_s:.2f}",
            f"{r.page_rate:.2f}",
            f"[{eff_style}]{r.efficiency:.3f}[/]",
            f"[{viol_style}]{r.violations}[/]",
            f"{r.max_in_window} ({r.limit:g})",
            f"{r.process_seconds:.1f}",
            f"{r.peak_rss_mb:,.0f}",
        )
    return table


def ratio_cell(ratio: float | None, target: float | None) -> str:
    if ratio is None:
        return "-"
    if target is None:
        return f"{ratio:.3f}"
    return f"[{'green' if ratio >= target else 'red'}]{ratio:.3f}[/]"


def join_table(runs: list[Politeness], title: str) -> Table:
    """Side by side per crawler and fetch-worker count: the pace a user waits for."""
    table = Table(title=title)
    table.add_column("crawler", no_wrap=True)
    for col in (
        "fetch workers",
        "pages",
        "exact",
        "publish → last stored s",
        "pages/s",
        "÷ sum of caps",
        "start → last stored s",
        "÷ sum of caps (start)",
        "publish → 1st request s",
        "last request → stored s",
        "efficiency (server)",
        "violations",
    ):
        table.add_column(col, justify="right")
    for r in runs:
        crawlfleet = r.fetch_workers > 0
        publish_rate = r.reported_pages / r.publish_seconds if r.publish_seconds > 0 else 0.0
        table.add_row(
            r.name,
            str(r.fetch_workers) if crawlfleet else "-",
            str(r.reported_pages),
            "[green]yes[/]" if r.exact else "[red]NO[/]",
            f"{r.publish_seconds:.2f}" if crawlfleet else "-",
            f"{publish_rate:.2f}" if crawlfleet else "-",
            ratio_cell(r.publish_ratio, TARGET_PUBLISH_RATIO) if crawlfleet else "-",
            f"{r.start_seconds if crawlfleet else r.process_seconds:.2f}",
            ratio_cell(r.start_ratio, None),
            f"{r.first_request_s:.2f}" if crawlfleet else "-",
            f"{r.tail_s:.2f}" if crawlfleet else "-",
            ratio_cell(r.efficiency, TARGET_EFFICIENCY),
            f"[{'green' if r.violations == 0 else 'red'}]{r.violations}[/]",
        )
    return table


def host_table(run: Politeness) -> Table:
    table = Table(title=f"{run.name}: per-host timing (s from its first request)")
    table.add_column("host")
    for col in (
        "requests",
        "first @",
        "last @",
        "req/s first..last",
        "median gap",
        "p99 gap",
        "max gap",
        "max/1s",
        "violations",
    ):
        table.add_column(col, justify="right")
    for h in run.hosts:
        table.add_row(
            h.host,
            str(h.requests),
            f"{h.first_s:.2f}",
            f"{h.last_s:.2f}",
            f"{h.active_rate:.2f}",
            f"{h.median_gap_s:.3f}",
            f"{h.p99_gap_s:.3f}",
            f"{h.max_gap_s:.3f}",
            str(h.max_in_window),
            str(h.violations),
        )
    return table
