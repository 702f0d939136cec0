"""What the cost benchmark reads while and after a crawl runs: CPU of every process by role
(the broker's JVM included), on-disk bytes of the fetch stage's stores over time, a topic's
committed records with their timestamps, and ClickHouse's compressed bytes.

Kept apart from ``bench.cost_bench`` (which crawls and writes ``infra/costs.json``) so each
reading is a small function with one source: ``/proc`` for CPU, the data dir for state,
the broker for records, chDB's ``system.parts`` for the store.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.crawl_bench import _descendants
from bench.proc_costs import ProcCosts
from infra.clickhouse import Store


def dir_bytes(path: Path, suffix: str = "") -> int:
    """Bytes of the files below ``path`` (0 if it has gone)."""
    total = 0
    for p in path.rglob(f"*{suffix}"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:  # RocksDB removed it between the listing and the stat
            continue
    return total


@dataclass
class Sampler:
    """Samples, every ``every_s``, the CPU of this process's descendants and of the broker
    JVMs (from their value at start), and the on-disk bytes of each named store directory."""

    broker_pids: list[int]
    store_dirs: dict[str, Path]
    every_s: float = 0.2
    cpu: ProcCosts = field(default_factory=ProcCosts)
    disk: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # (unix s, bytes)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.cpu.sample(_descendants(os.getpid()) + self.broker_pids, with_pss=False)
            now = time.time()
            for name, path in self.store_dirs.items():
                self.disk.setdefault(name, []).append((now, dir_bytes(path)))

    def __enter__(self) -> Sampler:
        self.cpu.watch_outside(self.broker_pids)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.cpu.sample(self.broker_pids, with_pss=False)  # the broker's last word

    def cpu_by_role(self) -> dict[str, float]:
        return {role: c.cpu_s for role, c in self.cpu.by_role().items()}


@dataclass(frozen=True)
class Written:
    """What a topic holds: every committed record's (timestamp s, key, has a value)."""

    records: list[tuple[float, bytes, bool]]
    value_bytes: int  # key + value bytes of the records with a value

    @property
    def values(self) -> int:
        return sum(1 for _, _, v in self.records if v)

    def distinct_keys(self) -> int:
        return len({k for _, k, v in self.records if v})

    def live_at(self, t: float) -> int:
        """Keys with a live value at ``t`` (a tombstone takes its key back)."""
        live: set[bytes] = set()
        for ts, key, has_value in sorted(self.records):
            if ts > t:
                break
            (live.add if has_value else live.discard)(key)
        return len(live)


def read_topic(bootstrap: str, topic: str) -> Written:
    """Every committed record of ``topic`` (read_committed: aborted ones are not counted)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cost-bench-{os.getpid()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    records: list[tuple[float, bytes, bool]] = []
    size = 0
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < len(parts):
            msg = c.poll(2.0)
            if msg is None:
                break  # the rest are transaction markers: nothing left to read
            if msg.error():
                continue
            value = msg.value()
            records.append((msg.timestamp()[1] / 1000, msg.key() or b"", value is not None))
            if value is not None:
                size += len(msg.key() or b"") + len(value)
            if (msg.offset() or 0) + 1 >= ends[msg.partition() or 0]:
                done.add(msg.partition() or 0)
    finally:
        c.close()
    return Written(records, size)


def bytes_per_live_key(samples: list[tuple[float, int]], written: Written) -> tuple[float, int]:
    """(on-disk bytes per live key, live keys) where the store held the most keys: each
    disk sample divided by the keys live at its time, taken at the sample of most keys."""
    best = (0.0, 0)
    for t, size in samples:
        live = written.live_at(t)
        if live > best[1] and size > 0:
            best = (size / live, live)
    return best


def store_bytes(store: Store) -> dict[str, dict[str, float]]:
    """Each table's active parts: compressed and uncompressed data bytes, bytes on disk."""
    _, rows = store.query(
        "SELECT table, sum(data_compressed_bytes), sum(data_uncompressed_bytes), "
        "sum(bytes_on_disk) FROM system.parts WHERE active AND database = currentDatabase() "
        "GROUP BY table ORDER BY table")
    return {str(t): {"compressed": float(c), "uncompressed": float(u), "on_disk": float(d)}
            for t, c, u, d in rows}
