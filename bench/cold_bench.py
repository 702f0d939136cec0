"""Cold start and small crawls beside Scrapy (issue 43, point 2).

What a user waits for who runs one small crawl in a new folder: ``crawlfleet crawl`` from a
fresh temporary directory (no ``.crawlfleet`` there, so its broker home is new and the crawl
formats and starts the broker itself, on a port of its own), with the per-user jar cache warm
(the jars were fetched once on the machine), at the default per-host cap; then Scrapy on the
same site at the same per-host rate (``bench.polite_peers``). For both: the command to the
site's first request (from the site's own request log), the command to its exit (wall), the
pages, and the site's count of requests over the cap. Targets: first request within 6 s, wall
at most 1.5x Scrapy's.

    python -m bench.cold_bench [--rounds 3] [--pages 100] [--hosts 4]

Every server is on 127.0.0.0/8 and started here; the broker this starts is stopped at the
end of each round and its home deleted. No other broker is touched (``CRAWLFLEET_KAFKA_PORT``
gives the new home its own port; ``XDG_STATE_HOME`` its own note of the user's broker, so the
crawl does not adopt one another folder started).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.crawl_bench import crawlfleet_command
from bench.peers import REPO_ROOT
from bench.polite_peers import run_polite_scrapy
from bench.proc_group import end_group, popen_reaper
from core.config import Settings
from infra import kafka_local
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite, free_port
from sites.site_spec import SiteSpec

TARGET_FIRST_REQUEST_S = 6.0
TARGET_WALL_RATIO = 1.5
#: The broker base port of the fresh folders' brokers (two ports: broker, controller).
DEFAULT_BROKER_PORT = 28496


@dataclass
class ColdRun:
    """One crawler's run: seconds from its command to the site's first request and to exit."""

    crawler: str
    first_request_s: float | None
    wall_s: float
    pages: int
    over_cap: int
    exit_code: int | None = 0
    #: crawlfleet only: its summary's own wall and its phases (seconds from its start)
    summary_wall_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


def _env(tmp: Path, broker_port: int) -> dict[str, str]:
    """This environment without any crawlfleet setting (no configured broker, home or jar
    dir), the repo importable, the new home on ``broker_port``, a note of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env[kafka_local.PORT_ENV] = str(broker_port)
    env["XDG_STATE_HOME"] = str(tmp / "state")
    return env


def _site(spec: SiteSpec, cap: float) -> DemoSite:
    # The site counts requests over the cap (it does not refuse them): politeness is shown.
    return DemoSite(spec, rate_cap=cap, rate_enforce=False)


def run_crawlfleet_cold(command: list[str], spec: SiteSpec, cap: float, broker_port: int,
                        timeout_s: float, log_path: Path) -> ColdRun:
    """``crawlfleet crawl`` from a fresh directory at the default cap; the broker it starts is
    stopped and its home deleted afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="cold-bench-"))
    work = tmp / "work"
    work.mkdir()
    seeds, summary = tmp / "seeds.txt", tmp / "summary.json"
    seeds.write_text("\n".join(spec.seeds()) + "\n")
    argv = [*command, "crawl", str(seeds), "--allow-private", "--scope", "seeds",
            "--summary-json", str(summary), "--timeout", f"{timeout_s:g}"]
    code: int | None = None
    try:
        with _site(spec, cap) as site, log_path.open("ab") as out:
            started = time.monotonic()
            proc = subprocess.Popen(argv, cwd=work, env=_env(tmp, broker_port), stdout=out,
                                    stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = proc.wait(timeout=timeout_s + 120)
            except subprocess.TimeoutExpired:
                end_group(proc.pid, popen_reaper(proc), 30.0)
            wall = time.monotonic() - started
            log = site.snapshot()[1]
            over = sum(site.rate_violations.values())
        data: dict[str, Any] = json.loads(summary.read_text()) if summary.exists() else {}
    finally:
        kafka_local.down(work / ".crawlfleet" / "kafka")
        shutil.rmtree(tmp, ignore_errors=True)
    return ColdRun("crawlfleet", log[0][0] - started if log else None, wall,
                   int(data.get("pages_stored", 0)), over, code,
                   float(data.get("seconds", 0.0)), dict(data.get("phases", {})))


def run_scrapy_cold(spec: SiteSpec, cap: float, timeout_s: float) -> ColdRun:
    """Scrapy (``bench.polite_peers``) on the same site at the same per-host rate."""
    with _site(spec, cap) as site:
        started = time.monotonic()
        res = run_polite_scrapy(spec.seeds(), list(spec.hosts), cap, timeout=timeout_s)
        wall = time.monotonic() - started
        log = site.snapshot()[1]
        over = sum(site.rate_violations.values())
    return ColdRun("scrapy", log[0][0] - started if log else None, wall, res.pages, over)


def _fmt(x: float | None) -> str:
    return "never" if x is None else f"{x:.2f} s"


def _phases(run: ColdRun) -> str:
    keys = ("broker", "workers_started", "topics", "published", "first_fetch", "drained",
            "stopped", "ended")
    return ", ".join(f"{k} {run.phases[k]:.2f}" for k in keys if k in run.phases)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pages", type=int, default=100)
    ap.add_argument("--hosts", type=int, default=4, help="loopback hosts the pages spread over")
    ap.add_argument("--page-bytes", type=int, default=6000)
    ap.add_argument("--broker-port", type=int, default=DEFAULT_BROKER_PORT)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--crawlfleet-cmd", default=None)
    ap.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "cold-bench.log")
    args = ap.parse_args(argv)
    command = crawlfleet_command(args.crawlfleet_cmd) or [sys.executable, "-m", "crawlfleet.cli"]
    cap = Settings().rate_cap  # the default cap, what a user gets
    # As installed: byte-compiled (pip does it), and the per-user jar cache warm.
    compileall.compile_dir(REPO_ROOT, quiet=1, rx=re.compile(r"/\.|/tests/"))
    saved = os.environ.pop(kafka_local.JARS_ENV, None)
    try:
        print(f"jar cache: {kafka_local.ensure_jars()}")
    finally:
        if saved is not None:
            os.environ[kafka_local.JARS_ENV] = saved
    port = free_port(tuple(f"127.0.0.{2 + k}" for k in range(args.hosts)))
    spec = bench_spec(port, pages=args.pages, hosts=args.hosts, page_bytes=args.page_bytes)
    print(f"site: {args.pages} pages on {args.hosts} hosts, cap {cap:g} requests/s per host; "
          f"crawlfleet's output: {args.log}")
    rows: list[tuple[ColdRun, ColdRun]] = []
    for n in range(1, args.rounds + 1):
        fleet = run_crawlfleet_cold(command, spec, cap, args.broker_port, args.timeout, args.log)
        scrapy = run_scrapy_cold(spec, cap, args.timeout)
        rows.append((fleet, scrapy))
        for r in (fleet, scrapy):
            extra = f"; summary wall {r.summary_wall_s:.2f} s, exit {r.exit_code}" \
                if r.crawler == "crawlfleet" else ""
            print(f"round {n} {r.crawler:10s}: first request {_fmt(r.first_request_s)}, "
                  f"wall {r.wall_s:.2f} s, {r.pages} pages, {r.over_cap} over the cap{extra}")
        print(f"round {n} phases (s from the command): {_phases(fleet)}")
        print(f"round {n} ratio (wall crawlfleet / scrapy): {fleet.wall_s / scrapy.wall_s:.2f}")
    firsts = [f.first_request_s for f, _ in rows]
    ratios = [f.wall_s / s.wall_s for f, s in rows]
    first_ok = all(x is not None and x <= TARGET_FIRST_REQUEST_S for x in firsts)
    ratio_ok = all(r <= TARGET_WALL_RATIO for r in ratios)
    print(f"first request ≤ {TARGET_FIRST_REQUEST_S:g} s: {'met' if first_ok else 'missed'} "
          f"({', '.join(_fmt(x) for x in firsts)})")
    print(f"wall ≤ {TARGET_WALL_RATIO:g}x Scrapy's: {'met' if ratio_ok else 'missed'} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")
    return 0 if first_ok and ratio_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
