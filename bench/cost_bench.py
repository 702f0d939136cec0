"""Per-page costs of a crawl, measured end to end with the default settings, for the plan.

    python -m bench.cost_bench [--pages 10000] [--hosts 8] [--page-bytes 12000]
                               [--out infra/costs.json]

Crawls a generated site (``infra.demo_site.bench_spec``, uncapped so the figures are the
pipeline's, not the caps') with ``crawlfleet crawl``'s own code path, on the local broker, and
measures, per page stored: CPU seconds of each stage's processes and of the broker (from
/proc: user + system, the processes' whole lives), bytes written to each topic (the run's log
segments on the broker's disk, one replica), the fetch stage's local dedupe state per key
(RocksDB directories), and ClickHouse's bytes on disk over every table (active parts). Prints
them and writes them to ``--out``, which ``crawlfleet plan`` reads. Run it with nothing else
on the machine; run it again after a change that moves a cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.crawl_bench import _descendants
from crawlfleet.config import load_settings
from crawlfleet.crawl import Plan, run_crawl
from infra import kafka_local
from infra.clickhouse import Store
from infra.demo_site import DemoSite, bench_spec, free_port
from infra.topics import delete_topics

TICKS = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parent.parent


def _cpu(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, ValueError, IndexError):
        return None


def _stage(pid: int) -> str | None:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"worker" in args and args.index(b"worker") + 1 < len(args):
        return args[args.index(b"worker") + 1].decode()
    return None


class StageCPU:
    """The last CPU reading of every stage process below this one (they exit at the end)."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for pid in _descendants(os.getpid()):
                stage = self.last[pid][0] if pid in self.last else _stage(pid)
                cpu = _cpu(pid) if stage else None
                if stage and cpu is not None:
                    self.last[pid] = (stage, cpu)

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for stage, cpu in self.last.values():
            out[stage] = out.get(stage, 0.0) + cpu
        return out

    def __enter__(self) -> StageCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _dir_bytes(path: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in path.rglob(f"*{suffix}") if p.is_file())


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(pages: int, hosts: int, page_bytes: int) -> dict[str, Any]:
    if not kafka_local.status().running:
        kafka_local.up()
    st = kafka_local.status()
    broker_pids = [n.pid for n in st.nodes if n.pid is not None]
    port = free_port(tuple(f"127.0.0.{2 + k}" for k in range(hosts)), 18700)
    spec = bench_spec(port, pages, hosts, page_bytes)
    with tempfile.TemporaryDirectory(prefix="cost-bench-") as tmp:
        s = load_settings(data_dir=Path(tmp) / "data", allow_private=True, rate_cap=100_000.0,
                          scope="seeds", bootstrap_servers=st.bootstrap_servers)
        broker_before = sum(_cpu(p) or 0.0 for p in broker_pids)
        with DemoSite(spec), StageCPU() as cpu:
            summary = run_crawl(s, spec.seeds(), Plan(), timeout_s=900, keep_topics=True)
        broker_cpu = sum(_cpu(p) or 0.0 for p in broker_pids) - broker_before
        stored = summary.pages_stored
        if not summary.drained or stored <= 0:
            raise RuntimeError(f"the crawl did not drain ({stored} pages stored)")
        prefix = summary.topic_prefix
        topic_bytes: dict[str, float] = {}
        for node in st.nodes:
            data = kafka_local.kafka_home() / f"node-{node.node_id}" / "data"
            for part in data.glob(f"{prefix}*-*"):
                topic = part.name[len(prefix):].rsplit("-", 1)[0].removeprefix("crawl.")
                topic_bytes[topic] = topic_bytes.get(topic, 0.0) + _dir_bytes(part, ".log")
        delete_topics(s.replace(topic_prefix=prefix), timeout_s=30)
        seen = sum(_dir_bytes(p) for p in (Path(tmp) / "data").rglob("seen") if p.is_dir())
        store = Store(s)
        try:
            ch_bytes = float(store.scalar("SELECT sum(bytes_on_disk) FROM system.parts "
                                          "WHERE active AND database = currentDatabase()"))
            body = float(store.scalar("SELECT avg(body_bytes) FROM pages FINAL"))
        finally:
            store.close()
    cpu_s = {k: v / stored for k, v in cpu.totals().items()}
    cpu_s["broker"] = broker_cpu / stored
    return {
        "cpu_s_per_page": cpu_s,
        "topic_bytes_per_page": {k: v / stored for k, v in sorted(topic_bytes.items())},
        "seen_bytes_per_key": seen / stored,
        "store_bytes_per_page": ch_bytes / stored,
        "page_bytes": body,
        "measured": {"pages": stored, "hosts": hosts, "commit": _git_commit(),
                     "at": datetime.now(UTC).isoformat(timespec="seconds"),
                     "crawl_seconds": round(summary.crawl_seconds, 2),
                     "settings": "defaults (uncapped: rate_cap 100000, scope seeds)"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--page-bytes", type=int, default=12_000)
    parser.add_argument("--out", type=Path, default=REPO / "infra" / "costs.json")
    args = parser.parse_args(argv)
    costs = measure(args.pages, args.hosts, args.page_bytes)
    text = json.dumps(costs, indent=2, sort_keys=True)
    print(text)
    args.out.write_text(text + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
