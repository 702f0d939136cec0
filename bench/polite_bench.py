"""Politeness benchmark: how close to a per-host cap crawlfleet and polite Scrapy crawl, unbroken.

    python -m bench.polite_bench [--hosts 10] [--pages 2000] [--cap 5] [--fetch-workers 1,2,4]
                                 [--scrapy-concurrency 16] [--port N]
                                 [--skip-scrapy] [--skip-crawlfleet]
                                 [--json-out bench/out/polite_bench.json]

Every host of the local site (``sites.bench_site.bench_spec``) has the same cap of ``--cap``
requests/s, so a crawler that keeps every host busy right up to its cap fetches at
``hosts x cap`` requests/s (the sum of caps) and no faster. Each crawler is told that cap in
its own terms:

* crawlfleet: ``crawlfleet crawl --rate-cap CAP --scope seeds --allow-private`` (the stage
  processes of ``bench.crawl_bench.run_crawlfleet``);
* Scrapy: ``ROBOTSTXT_OBEY``, ``DOWNLOAD_DELAY = 1/CAP`` without jitter,
  ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``, AutoThrottle off (``bench.polite_peers``).

Each crawler gets a fresh server and the server's request log is the referee:

* **efficiency** = page requests / crawl window / sum of caps, where the crawl window runs
  from that crawler's first request to its last (robots.txt requests bound the window and
  count against the cap, but are not pages);
* **violations** = (host, window) pairs where a closed 1-second window holds more than
  ``cap + burst`` requests to the host (robots.txt included). crawlfleet declares a burst of 1
  (a request may start exactly one interval after the previous one, so ``[t, t + 1]`` may
  hold ``cap + 1``); the same rule is applied to every crawler. Windows are anchored at each
  request, so a violation count of n means n requests opened an over-full window;
* **pages** crawled (the crawler's own count, and distinct expected URLs the server served)
  against ``spec.expected()``.

crawlfleet runs once per count in ``--fetch-workers`` (a list), each on a fresh site and with
the workers started together as ``crawlfleet crawl --fetch-workers N`` starts them, default
settings but the cap and scope flags above. For each it also reports how joining costs pace:

* **publish ratio** = pages stored ÷ (seeds' publication → last page stored, from the crawl's
  summary: the store's insert time) ÷ sum of caps. Unlike efficiency, which the server times
  from its first request to its last, it counts the wait for the first request, any
  rebalance after publication and the last pages' way to the store: what a user waits for;
* **start ratio** = the same from the moment the workers were started (start-up and the
  groups' first joins included); for Scrapy, from its process start to its exit;
* where the publish window goes beyond the server's: publication → first request, and last
  request → last page stored (the server's monotonic clock is mapped to wall time in this
  process, which hosts the server thread).

The target for crawlfleet is efficiency >= 0.95 with zero violations and the exact page set,
and a publish ratio >= 0.95 for every worker count; the exit status is 1 if a crawler failed
to run or crawlfleet missed either target. Scrapy runs once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.crawl_bench import (
    TreeMemorySampler,
    add_crawler_args,
    crawlfleet_command,
    run_crawlfleet,
)
from bench.peers import PeerResult
from bench.polite_analysis import (
    DECLARED_BURST,
    TARGET_EFFICIENCY,
    TARGET_PUBLISH_RATIO,
    LogEntry,
    Politeness,
    analyse,
)
from bench.polite_peers import run_polite_scrapy, scrapy_polite_settings
from bench.polite_report import host_table, join_table, ratio_cell, summary_table
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite, free_port
from sites.site_spec import SiteSpec


def parse_counts(text: str) -> list[int]:
    """``"1,2,4"`` → [1, 2, 4]: worker counts, each >= 1, in the order given, no repeats."""
    counts: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        n = int(part)
        if n < 1:
            raise ValueError(f"worker counts must be >= 1, got {n}")
        if n not in counts:
            counts.append(n)
    if not counts:
        raise ValueError("no worker count given")
    return counts


# -- running ---------------------------------------------------------------------------------------


def _crawl_on_fresh_site(
    spec: SiteSpec, fn: Callable[[], PeerResult | tuple[PeerResult, TreeMemorySampler]]
) -> tuple[PeerResult, list[LogEntry]]:
    with DemoSite(spec) as site:
        out = fn()
        log = site.snapshot()[1]
    result = out[0] if isinstance(out, tuple) else out
    return result, log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--cap", type=float, default=5.0, help="requests/s per host")
    parser.add_argument("--port", type=int, help="site port (default: first free from 18600)")
    parser.add_argument("--page-bytes", type=int, default=12_000)
    parser.add_argument("--links-per-page", type=int, default=10)
    parser.add_argument(
        "--fetch-workers",
        default="1,2,4",
        help="crawlfleet fetch workers: a count or a list (1,2,4), one crawl per count",
    )
    parser.add_argument(
        "--scrapy-concurrency", type=int, default=16, help="Scrapy CONCURRENT_REQUESTS"
    )
    add_crawler_args(parser, bare=False)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per-crawler seconds")
    parser.add_argument("--timeline", action="store_true", help="print requests per second")
    parser.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.cap <= 0:
        parser.error("--cap must be > 0")
    try:
        worker_counts = parse_counts(args.fetch_workers)
    except ValueError as exc:
        parser.error(f"--fetch-workers: {exc}")
    console = Console(width=None if sys.stdout.isatty() else 160)

    command = None
    if not args.skip_crawlfleet:
        command = crawlfleet_command(args.crawlfleet_cmd)
        if command is None:
            console.print("[red]crawlfleet command not found[/]; pass --crawlfleet-cmd")
            return 2

    host_ips = [f"127.0.0.{2 + k}" for k in range(args.hosts)]
    port = args.port if args.port is not None else free_port(host_ips, start=18600)
    spec = bench_spec(port, args.pages, args.hosts, args.page_bytes, args.links_per_page)
    expected = set(spec.expected())
    seeds, hosts = spec.seeds(), list(spec.hosts)
    sum_caps = args.cap * len(hosts)

    # run_crawlfleet passes `--rate-cap 100000` (its throughput setting) first; a click option
    # given twice takes its last value, so this --rate-cap is the one crawlfleet uses.
    def fleet_args(workers: int) -> list[str]:
        return [
            "--rate-cap",
            f"{args.cap:g}",
            "--fetch-workers",
            str(workers),
            *args.crawlfleet_arg,
        ]

    scrapy_settings = scrapy_polite_settings(args.cap, args.scrapy_concurrency)
    console.print(
        f"site: {args.pages} pages x ~{args.page_bytes} B on {len(hosts)} hosts "
        f"({hosts[0]}..{hosts[-1]}:{port}), {len(expected)} URLs expected\n"
        f"cap: {args.cap:g} req/s per host, sum of caps {sum_caps:g} req/s "
        f"(ideal crawl ~{len(expected) / sum_caps:.0f} s); violation = more than "
        f"{args.cap + DECLARED_BURST:g} requests to a host in a closed 1 s window "
        f"(cap + declared burst {DECLARED_BURST})\n"
        f"crawlfleet: crawl --allow-private --scope seeds "
        f"{' '.join(fleet_args(worker_counts[0]))} (fetch workers: "
        f"{', '.join(map(str, worker_counts))})\n"
        f"scrapy: {', '.join(f'{k}={v!r}' for k, v in scrapy_settings.items())}\n"
        f"server in-process thread, crawlers in subprocesses; {os.cpu_count()} CPUs"
    )

    Crawl = Callable[[], PeerResult | tuple[PeerResult, TreeMemorySampler]]
    plan: list[tuple[str, int, Crawl, dict[str, Any]]] = []
    if not args.skip_scrapy:
        plan.append(
            (
                "scrapy",
                0,
                lambda: run_polite_scrapy(
                    seeds, hosts, args.cap, args.scrapy_concurrency, args.timeout
                ),
                {},
            )
        )
    if command is not None:
        for workers in worker_counts:
            summary: dict[str, Any] = {}

            def crawl(
                cmd: list[str] = command, n: int = workers, sink: dict[str, Any] = summary
            ) -> tuple[PeerResult, TreeMemorySampler]:
                return run_crawlfleet(cmd, spec, fleet_args(n), args.timeout, summary_sink=sink)

            plan.append((f"crawlfleet ({workers} fetch)", workers, crawl, summary))

    runs: list[Politeness] = []
    for name, workers, fn, summary in plan:
        console.print(f"running {name} ...")
        try:
            result, log = _crawl_on_fresh_site(spec, fn)
        except RuntimeError as exc:
            console.print(f"[red]{name} failed:[/] {exc}")
            continue
        run = analyse(result, log, spec, expected, args.cap)
        if workers:
            run.name = name if result.name == "crawlfleet" else f"{name} {result.name[10:]}"
            run.fetch_workers = workers
            run.publish_seconds = float(summary.get("publish_seconds") or 0.0)
            run.start_seconds = float(summary.get("start_seconds") or 0.0)
            published = float(summary.get("published_at") or 0.0)
            if log and published and run.publish_seconds:
                wall = time.time() - time.monotonic()  # the site logs time.monotonic()
                run.first_request_s = min(t for t, _, _ in log) + wall - published
                run.tail_s = published + run.publish_seconds - (max(t for t, _, _ in log) + wall)
        runs.append(run)
        joins = (
            f"; publish → last stored {run.publish_seconds:.2f} s, "
            f"{ratio_cell(run.publish_ratio, None)} of the sum of caps (first request "
            f"{run.first_request_s:.2f} s after publication, last page stored "
            f"{run.tail_s:.2f} s after the last request)"
            if workers
            else ""
        )
        console.print(
            f"  {run.page_requests} page requests in {run.window_s:.2f} s = "
            f"{run.page_rate:.2f}/s, efficiency {run.efficiency:.3f}, "
            f"{run.violations} violations (max {run.max_in_window} in 1 s){joins}"
        )

    console.print(
        summary_table(
            runs,
            f"politeness: {len(hosts)} hosts x cap {args.cap:g} req/s, "
            f"{len(expected)} pages expected, sum of caps {sum_caps:g} req/s",
        )
    )
    for run in runs:
        console.print(host_table(run))
        if args.timeline:
            console.print(f"{run.name} requests per second: {run.per_second}")
    console.print(
        join_table(
            runs,
            f"joins: pages/s from the seeds' publication (or the start) to the last page "
            f"stored ÷ sum of caps {sum_caps:g} req/s",
        )
    )

    ok = len(runs) == len(plan)
    for fleet in (r for r in runs if r.fetch_workers):
        verdict = "[green]met[/]" if fleet.meets_target else "[red]MISSED[/]"
        joined = "[green]met[/]" if fleet.meets_join_target else "[red]MISSED[/]"
        console.print(
            f"{fleet.name}: target (efficiency >= {TARGET_EFFICIENCY}, 0 violations, exact "
            f"pages) {verdict}; publish ratio >= {TARGET_PUBLISH_RATIO} {joined}"
        )
        ok = ok and fleet.meets_target and fleet.meets_join_target

    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        payload: dict[str, Any] = {
            "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "port": port,
            "expected": len(expected),
            "sum_of_caps": sum_caps,
            "declared_burst": DECLARED_BURST,
            "scrapy_settings": scrapy_settings,
            "crawlfleet_args": fleet_args(worker_counts[0]),
            "fetch_workers": worker_counts,
            "cpus": os.cpu_count(),
            "runs": [
                {
                    **asdict(r),
                    "exact": r.exact,
                    "meets_target": r.meets_target,
                    "publish_ratio": r.publish_ratio,
                    "start_ratio": r.start_ratio,
                    "meets_join_target": r.meets_join_target,
                    "hosts": [{**asdict(h), "active_rate": h.active_rate} for h in r.hosts],
                }
                for r in runs
            ],
        }
        args.json_out.write_text(json.dumps(payload, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
