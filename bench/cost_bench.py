"""Per-page costs of a crawl, measured end to end with the default settings, for the plan.

    python -m bench.cost_bench [--pages 10000] [--hosts 8] [--page-bytes 12000]
                               [--out infra/costs.json]

Crawls a generated site (``sites.bench_site.bench_spec``, uncapped so the figures are the
pipeline's, not the caps') with ``crawlfleet crawl``'s own code path, on the local broker, and
measures, per page stored: CPU seconds of each stage's processes and of the broker (from
/proc: user + system, the processes' whole lives), bytes written to each topic (the run's log
segments on the broker's disk, one replica), the fetch stage's local dedupe state per key
(RocksDB directories), and ClickHouse's bytes on disk over every table (active parts).

An uncapped crawl parks nothing and retries little, so a second, capped crawl (the
``mixed-50`` shape at a tenth of its size, 2 requests/s per host: work beyond each host's
share parks; 3% of pages answer 503 once: retries wait in timers) measures the held-work
stores: records written to ``crawl.parked`` and ``crawl.timers`` per page and the bytes of
each live record (key + value, uncompressed: what a worker's state store and the changelog
hold per parked job or timer). Prints them and writes them to ``--out``, which ``crawlfleet
plan`` reads. Run it with nothing else on the machine; run it again after a change that
moves a cost.
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

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.crawl_bench import _descendants
from core.config import load_settings
from crawlfleet.crawl import run_crawl
from crawlfleet.fleet import Plan
from infra import kafka_local
from infra.clickhouse import Store
from infra.topics import delete_topics
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite, free_port
from sites.shapes import shape_spec

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


def _records(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records with a value, their key + value bytes) written to ``topic``, committed
    transactions only; tombstones (a parked job taken back, a timer fired) not counted."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cost-bench-{os.getpid()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        done = {p for p, end in ends.items() if end == 0}
        n = size = 0
        while len(done) < len(parts):
            msg = c.poll(2.0)
            if msg is None:
                break  # the rest are transaction markers: nothing left to read
            if msg.error():
                continue
            if msg.value() is not None:
                n += 1
                size += len(msg.key() or b"") + len(msg.value() or b"")
            if (msg.offset() or 0) + 1 >= ends[msg.partition() or 0]:
                done.add(msg.partition() or 0)
        return n, size
    finally:
        c.close()


def measure_held(bootstrap: str, scale: float = 0.1, cap: float = 2.0) -> dict[str, Any]:
    """Parked jobs and timers per page, and bytes per live record, on a capped crawl."""
    hosts = tuple(f"127.0.0.{2 + k}" for k in range(50))
    spec = shape_spec("mixed-50", free_port(hosts, 18800), scale)
    with tempfile.TemporaryDirectory(prefix="cost-bench-held-") as tmp:
        s = load_settings(data_dir=Path(tmp) / "data", allow_private=True, rate_cap=cap,
                          scope="seeds", bootstrap_servers=bootstrap)
        with DemoSite(spec):
            summary = run_crawl(s, spec.seeds(), Plan(), timeout_s=900, keep_topics=True)
        stored = summary.pages_stored
        if not summary.drained or stored <= 0:
            raise RuntimeError(f"the capped crawl did not drain ({stored} pages stored)")
        prefix = summary.topic_prefix
        parked, parked_bytes = _records(bootstrap, f"{prefix}crawl.parked")
        timers, timer_bytes = _records(bootstrap, f"{prefix}crawl.timers")
        delete_topics(s.replace(topic_prefix=prefix), timeout_s=30)
    return {
        "parked_per_page": parked / stored,
        "parked_bytes_per_record": parked_bytes / parked if parked else 0.0,
        "timers_per_page": timers / stored,
        "timer_bytes_per_record": timer_bytes / timers if timers else 0.0,
        "measured": {"pages": stored, "shape": f"mixed-50 x{scale:g}", "cap": cap,
                     "parked": parked, "timers": timers,
                     "crawl_seconds": round(summary.crawl_seconds, 2)},
    }


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
    costs["held"] = measure_held(kafka_local.status().bootstrap_servers)
    text = json.dumps(costs, indent=2, sort_keys=True)
    print(text)
    args.out.write_text(text + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
