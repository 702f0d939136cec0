"""Dedupe-store benchmark: the RocksDB SeenStore against a plain dict holding the same keys.

    python -m bench.seen_bench [--keys 2000000] [--batch 1000] [--seed 7]
                               [--json-out bench/out/seen_bench.json]

Each implementation runs in its own subprocess (so neither's memory is in the other's figures):
it inserts ``--keys`` realistic dedupe keys (``default|http://127.0.0.<x>:18080/path/<i>?q=<i>``)
into one partition in batches, the way the fetch stage applies committed state, then does
keys/10 random gets of present keys and keys/10 of absent ones. Printed per implementation:
insert and get seconds, process peak RSS (VmHWM), RSS growth over the run (end VmRSS minus
VmRSS before the first insert), on-disk bytes, and bytes per key of each. Times are given as
wall and as CPU seconds of the process (all threads, so RocksDB's background compactions are
counted), the latter being steadier on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

IMPLS = ("rocksdb", "dict")


def key_of(i: int) -> str:
    return f"default|http://127.0.0.{i % 250 + 1}:18080/path/{i}?q={i}"


def state_of(i: int) -> tuple[str, int]:
    r = i % 50
    if r == 0:
        return "DEAD", 3
    if r < 5:
        return "RETRYING", 1 + r % 2
    return "DONE", 0


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _cpu() -> float:
    """CPU seconds of this process, all threads (RocksDB's compactions included)."""
    t = os.times()
    return t.user + t.system


def _disk_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def run_one(impl: str, keys: int, batch: int, seed: int) -> dict[str, Any]:
    """Run one implementation in this process; returns its figures."""
    from consumers.fetch.seen import SeenStore  # imported before the baseline, like the dict

    workdir = Path(tempfile.mkdtemp(prefix="seen-bench-"))
    store = SeenStore.at(workdir / "w") if impl == "rocksdb" else None
    table: dict[str, tuple[str, int]] = {}
    if store is not None:
        store.open(0)
    rng = random.Random(seed)
    hits = [rng.randrange(keys) for _ in range(keys // 10)]
    misses = [keys + rng.randrange(keys) for _ in range(keys // 10)]
    rss0 = _status_kb("VmRSS")

    t0, c0 = time.perf_counter(), _cpu()
    for start in range(0, keys, batch):
        items = [(0, key_of(i), *state_of(i)) for i in range(start, min(keys, start + batch))]
        if store is not None:
            store.put_many(items)
        else:
            for _, k, st, att in items:
                table[k] = (st, att)
    insert_s, insert_cpu = time.perf_counter() - t0, _cpu() - c0

    t0, c0 = time.perf_counter(), _cpu()
    for i in hits:
        got = store.get(0, key_of(i)) if store is not None else table.get(key_of(i))
        if got != state_of(i):
            raise AssertionError(f"key {i}: {got} != {state_of(i)}")
    get_s, get_cpu = time.perf_counter() - t0, _cpu() - c0
    t0, c0 = time.perf_counter(), _cpu()
    for i in misses:
        got = store.get(0, key_of(i)) if store is not None else table.get(key_of(i))
        if got is not None:
            raise AssertionError(f"absent key {i} found")
    miss_s, miss_cpu = time.perf_counter() - t0, _cpu() - c0

    rss_end = _status_kb("VmRSS")
    peak = _status_kb("VmHWM")
    counted = len(store) if store is not None else len(table)
    disk = 0
    if store is not None:
        store.close()  # flushes the memtable: everything is on disk
        disk = _disk_bytes(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    growth = (rss_end - rss0) * 1024
    return {"impl": impl, "keys": keys, "len": counted, "insert_s": insert_s,
            "insert_cpu_s": insert_cpu, "get_hits": len(hits), "get_hit_s": get_s,
            "get_hit_cpu_s": get_cpu, "get_misses": len(misses), "get_miss_s": miss_s,
            "get_miss_cpu_s": miss_cpu, "rss_start_bytes": rss0 * 1024,
            "rss_end_bytes": rss_end * 1024,
            "peak_rss_bytes": peak * 1024, "rss_growth_bytes": growth,
            "peak_growth_bytes": peak * 1024 - rss0 * 1024, "disk_bytes": disk,
            "rss_bytes_per_key": growth / keys, "disk_bytes_per_key": disk / keys}


def _child(impl: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.seen_bench", "--impl", impl, "--keys", str(args.keys),
           "--batch", str(args.batch), "--seed", str(args.seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise SystemExit(f"{impl} run failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB"


def report(results: list[dict[str, Any]]) -> Table:
    table = Table(title=f"seen store, {results[0]['keys']:,} keys (one partition)")
    table.add_column("")
    for r in results:
        table.add_column(r["impl"], justify="right")
    rows: list[tuple[str, Any]] = [
        ("keys (len())", lambda r: f"{r['len']:,}"),
        ("insert, wall", lambda r: f"{r['insert_s']:.2f} s ({r['keys'] / r['insert_s']:,.0f}/s)"),
        ("insert, CPU", lambda r: f"{r['insert_cpu_s']:.2f} s"),
        ("gets present, wall", lambda r: f"{r['get_hit_s']:.2f} s ({r['get_hits']:,})"),
        ("gets present, CPU", lambda r: f"{r['get_hit_cpu_s']:.2f} s"),
        ("gets absent, wall", lambda r: f"{r['get_miss_s']:.2f} s ({r['get_misses']:,})"),
        ("gets absent, CPU", lambda r: f"{r['get_miss_cpu_s']:.2f} s"),
        ("RSS before inserts", lambda r: _mb(r["rss_start_bytes"])),
        ("peak RSS (VmHWM)", lambda r: _mb(r["peak_rss_bytes"])),
        ("RSS growth over run", lambda r: _mb(r["rss_growth_bytes"])),
        ("peak RSS growth", lambda r: _mb(r["peak_growth_bytes"])),
        ("on disk", lambda r: _mb(r["disk_bytes"])),
        ("memory bytes/key", lambda r: f"{r['rss_bytes_per_key']:.1f}"),
        ("disk bytes/key", lambda r: f"{r['disk_bytes_per_key']:.1f}"),
    ]
    for label, fmt in rows:
        table.add_row(label, *[fmt(r) for r in results])
    return table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--impl", choices=IMPLS, help="run one implementation here (JSON out)")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    if args.impl:
        print(json.dumps(run_one(args.impl, args.keys, args.batch, args.seed)))
        return
    results = [_child(impl, args) for impl in IMPLS]
    Console().print(report(results))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
