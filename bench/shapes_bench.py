"""Shapes benchmark: crawlfleet, Scrapy and the bare aiohttp loop on several site shapes, one run.

    python -m bench.shapes_bench [--shapes few-large,mixed-50,deep-chain,skewed-polite]
                                 [--repeat 1] [--pages-scale 1.0] [--concurrency 64] [--port N]
                                 [--timeout 900] [--skewed-timeout 180] [--warmup-pages 2000]
                                 [--skip-crawlfleet] [--skip-scrapy] [--skip-bare]
                                 [--json-out bench/out/shapes_bench.json] [--log-dir DIR]

One site shape says little about a crawler: a throughput figure from eight equal hosts hides
what few hosts, many failing hosts, a deep chain or one huge host beside small ones do to it.
Each shape (``sites.shapes.shape_spec``) gets a fresh server per run, in a thread of this
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
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.crawl_bench import add_crawler_args, crawlfleet_command, run_crawlfleet
from bench.shapes_crawls import run_skewed, run_uncapped, time_first_request, uncapped_runner
from bench.shapes_referee import Robots
from bench.shapes_report import (
    costs_table,
    crawlfleet_timeline,
    print_tail,
    shape_table,
    skewed_table,
    summary_table,
)
from bench.shapes_runs import (
    CRAWLERS,
    SKEWED,
    FirstRequest,
    ShapeRun,
    SkewedRun,
    median_shape_run,
    median_skewed_run,
)
from infra import kafka_local
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite, free_port
from sites.shapes import SHAPES, SkewedSite, shape_spec

TARGET_FIRST_REQUEST_S = 3.0


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
        robots = Robots(spec)
        console.rule(f"{shape}: {len(spec.hosts)} hosts, {len(expected)} pages expected")
        runs: dict[str, list[ShapeRun]] = {c: [] for c in crawlers}
        skewed: dict[str, list[SkewedRun]] = {c: [] for c in crawlers}
        for round_no in range(1, repeat + 1):
            for crawler in crawlers:
                console.print(f"round {round_no}/{repeat}: {crawler} ...")
                output = log_dir / f"{shape}-{crawler}-{round_no}.log"
                if isinstance(spec, SkewedSite):
                    s = run_skewed(
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
                fn = uncapped_runner(crawler, spec, args, command, output, sink)
                r = run_uncapped(shape, crawler, spec, expected, robots, fn, sink)
                runs[crawler].append(r)
                if r.error is not None:
                    failures += 1
                    console.print(f"  [red]failed:[/] {r.error}")
                if crawler == "crawlfleet" and not r.exact:
                    print_tail(console, output)
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
            medians = [median_skewed_run(rs) for rs in skewed.values() if rs]
            skewed_runs.extend(medians)
            if medians:
                console.print(skewed_table(spec, medians, args.skewed_timeout))
            every_run[shape] = {c: [asdict(x) for x in rs] for c, rs in skewed.items()}
        else:
            by_shape[shape] = {c: median_shape_run(rs) for c, rs in runs.items() if rs}
            if by_shape[shape]:
                console.print(shape_table(shape, spec, list(by_shape[shape].values()), repeat))
                fleet = by_shape[shape].get("crawlfleet")
                if fleet is not None and fleet.costs:
                    console.print(costs_table(shape, fleet))
            every_run[shape] = {
                c: [{**asdict(x), "exact": x.exact} for x in rs] for c, rs in runs.items()
            }

    console.rule("summary")
    if by_shape:
        console.print(summary_table(by_shape))
    skewed_spec = specs.get(SKEWED)
    if skewed_runs and isinstance(skewed_spec, SkewedSite):
        console.print(skewed_table(skewed_spec, skewed_runs, args.skewed_timeout))
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


if __name__ == "__main__":
    sys.exit(main())
