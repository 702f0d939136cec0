"""What a fleet costs while it waits: idle and polite-rate CPU, every process, beside Scrapy.

    python -m bench.idle_bench [--window 60] [--pages-per-s 2] [--port 28692] [--skip-scrapy]
                               [--skip-one-off] [--profile DIR]

A polite fleet spends most of its life waiting (a site at its cap, a crawl between revisits),
so its cost per page at full speed says little about what it costs to keep. Four figures, each
every process's CPU-seconds a minute (``/proc``: user + system), on a broker of this
benchmark's own (a fresh home in a temporary directory, on ``--port``) and default settings:

1. **bare broker**: the broker with no client, its floor;
2. **idle fleet**: deployed as README's cluster section says (``topics create``, one worker
   per stage, the quarantine app), joined and with nothing to do;
3. **polite fleet**: the same fleet crawling a one-host site of ~12 KB pages at the default
   cap (2 requests/s, so 2 pages/s): its CPU a page above the idle fleet's own;
4. **one-off crawl**: ``crawlfleet crawl`` of the same shape (its own loop, the ``crawl``
   command, is a process of its own in the figures), sampled over the same window;

and Scrapy (``bench.polite_peers``: ``DOWNLOAD_DELAY`` 0.5 s, one request per host at a time)
crawling the same shape at the same rate, its CPU a page and a minute. The site's request log
counts the pages each window fetched.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.polite_peers import run_polite_scrapy
from bench.proc_costs import cmdline, cpu_seconds, role_of
from core.config import Settings, load_settings
from crawlfleet.crawl import wait_ready
from crawlfleet.fleet import Fleet, Plan
from infra import kafka_local
from infra.topics import create_topics
from producers.frontier import publish
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite, free_port

Costs = dict[str, float]  # role -> CPU-seconds a minute


def _descendants(root: int) -> list[int]:
    out, todo = [], [root]
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def sample(pids: Callable[[], list[int]], window_s: float) -> Costs:
    """CPU-seconds a minute of each role over ``window_s`` (pids read at start and end)."""
    first = {p: cpu_seconds(p) for p in pids()}
    roles = {p: role_of(cmdline(p)) for p in first}
    time.sleep(window_s)
    out: Costs = {}
    for p in set(first) | set(pids()):
        end = cpu_seconds(p)
        if end is None:
            continue
        role = roles.get(p) or role_of(cmdline(p))
        out[role] = out.get(role, 0.0) + (end - (first.get(p) or 0.0)) * 60.0 / window_s
    return out


def _line(name: str, costs: Costs, extra: str = "") -> str:
    total = sum(costs.values())
    parts = ", ".join(f"{r} {v:.2f}" for r, v in sorted(costs.items(), key=lambda kv: -kv[1]))
    return f"{name:<16} {total:6.2f} CPU-s/min ({total / 60 * 100:4.1f}% of a core)  {extra}\n" \
           f"{'':<16} {parts}"


def _site(pages: int) -> DemoSite:
    return DemoSite(bench_spec(free_port(), pages=pages, hosts=1))


def _fetched(site: DemoSite) -> int:
    counts, _ = site.snapshot()
    return sum(n for path, n in counts.items() if not path.endswith("/robots.txt"))


def run(args: argparse.Namespace, work: Path) -> list[str]:
    out: list[str] = []
    home = work / "kafka"
    bootstrap = kafka_local.up(nodes=1, base_dir=home, base_port=args.port, heap_mb=512)
    broker = [n.pid for n in kafka_local.status(home).nodes if n.pid is not None]
    try:
        time.sleep(args.settle)
        bare = sample(lambda: broker, args.window)
        out.append(_line("bare broker", bare))
        s = load_settings(bootstrap_servers=bootstrap, topic_prefix="idle.",
                          data_dir=work / "data", allow_private=True)
        out += _fleet(s, work, broker, bare, args)
        if not args.skip_one_off:
            out.append(_one_off(bootstrap, work, broker, args))
    finally:
        kafka_local.down(home)
    if not args.skip_scrapy:
        pages = int(args.window * args.pages_per_s * 1.2) + 20
        with _site(pages) as site:
            r = run_polite_scrapy(site.spec.seeds(), list(site.spec.hosts), cap=args.pages_per_s)
        per_min = r.cpu_s * 60.0 / max(r.process_seconds, 1e-9)
        out.append(_line("scrapy (polite)", {"scrapy": per_min},
                         f"{r.pages} pages in {r.seconds:.1f} s; "
                         f"{r.cpu_s / max(r.pages, 1) * 1000:.1f} ms CPU a page (start-up in)"))
    return out


def _fleet(s: Settings, work: Path, broker: list[int], bare: Costs,
           args: argparse.Namespace) -> list[str]:
    create_topics(s)
    fleet = Fleet(s, Plan(), work / "logs")
    fleet.start()
    try:
        wait_ready(s, fleet, 120)
        time.sleep(args.settle)

        def pids() -> list[int]:
            return broker + [p.pid for p in fleet.procs.values()]

        idle = sample(pids, args.window)
        above = sum(idle.values()) - sum(bare.values())
        lines = [_line("idle fleet", idle, f"{above / 60 * 100:.1f}% of a core above the "
                                            f"bare broker (target <= 2%)")]
        pages = int(args.window * args.pages_per_s * 2) + 50  # outlasts the window
        with _site(pages) as site:
            publish(site.spec.seeds(), s)
            _until(lambda: _fetched(site) > 0, 60)
            before = _fetched(site)
            spies = _profile(args, {w: p.pid for w, p in fleet.procs.items()})
            busy = sample(pids, args.window)
            n = _fetched(site) - before
            for spy in spies:
                spy.wait(30)
        per_page = (sum(busy.values()) - sum(idle.values())) * args.window / 60 / max(n, 1)
        lines.append(_line("polite fleet", busy, f"{n} pages in {args.window:.0f} s; "
                           f"{per_page * 1000:.1f} ms CPU a page above idle (target <= 10)"))
        return lines
    finally:
        fleet.stop()


def _profile(args: argparse.Namespace, pids: dict[str, int]) -> list[subprocess.Popen[bytes]]:
    """py-spy on every fleet worker for the polite window (``--profile DIR``): collapsed
    stacks, one file a worker, idle frames left out -- where a polite page's CPU goes."""
    if not args.profile:
        return []
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).with_name("py-spy"))
    return [subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(int(args.window)),
                              "-r", "100", "-f", "raw", "-o", str(out / f"{wid}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for wid, pid in pids.items()]


def _one_off(bootstrap: str, work: Path, broker: list[int], args: argparse.Namespace) -> str:
    pages = int(args.window * args.pages_per_s * 2) + 50
    with _site(pages) as site:
        seeds = work / "seeds.txt"
        seeds.write_text("\n".join(site.spec.seeds()) + "\n")
        cmd = [sys.executable, "-m", "crawlfleet.cli", "crawl", str(seeds), "--allow-private",
               "--scope", "seeds", "--bootstrap", bootstrap]
        env = {**os.environ, "CRAWLFLEET_DATA_DIR": str(work / "oneoff")}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            _until(lambda: _fetched(site) > 0, 120)
            time.sleep(args.settle / 2)
            before = _fetched(site)
            costs = sample(lambda: broker + _descendants(proc.pid), args.window)
            n = _fetched(site) - before
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    total = sum(costs.values())
    return _line("one-off crawl", costs, f"{n} pages in {args.window:.0f} s; "
                 f"{total * args.window / 60 / max(n, 1) * 1000:.1f} ms CPU a page, all in")


def _until(pred: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("the crawl sent no request")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--window", type=float, default=60.0, help="seconds each figure samples")
    p.add_argument("--settle", type=float, default=15.0, help="seconds before each sample")
    p.add_argument("--pages-per-s", type=float, default=2.0, help="the site's cap (default's)")
    p.add_argument("--port", type=int, default=28692)
    p.add_argument("--skip-scrapy", action="store_true")
    p.add_argument("--skip-one-off", action="store_true")
    p.add_argument("--profile", default="", help="a folder: py-spy each worker's polite window")
    args = p.parse_args(argv)
    os.environ.setdefault(kafka_local.JARS_ENV, str(kafka_local.ensure_jars()))
    with tempfile.TemporaryDirectory(prefix="crawlfleet-idle-") as tmp:
        lines = run(args, Path(tmp))
    print(f"load average {os.getloadavg()[0]:.1f}; window {args.window:.0f} s")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
