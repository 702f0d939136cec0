"""A capacity plan from measured per-page costs: ``crawlfleet plan --pages-per-day N ...``.

The per-page costs are measured, never guessed: ``python -m bench.cost_bench`` crawls a
generated site end to end with the default settings and writes ``infra/costs.json`` (CPU
seconds per page of each stage and of the broker, bytes per page written to each topic, bytes
per dedupe key in the fetch stage's state and per page in ClickHouse). This module only does
arithmetic on them. What it cannot measure here -- the size of real pages, the machines of a
deployment -- are inputs with stated defaults (``NodeLimits``), printed beside the plan.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from schemas.pipeline import handles_pages
from schemas.stages import stages

COSTS = Path(__file__).resolve().parent.parent / "infra" / "costs.json"
DAY_S = 86_400


@dataclass(frozen=True)
class Costs:
    """Per-page costs of one measured run (see ``bench/cost_bench.py``)."""

    cpu_s: dict[str, float]  # per page, by stage and "broker"
    topic_bytes: dict[str, float]  # per page written to each topic (one replica)
    seen_bytes_per_key: float  # fetch stage's local dedupe state (RocksDB) per key
    store_bytes_per_page: float  # ClickHouse on disk (compressed), all tables
    page_bytes: float  # mean body size of the measured site
    measured: dict[str, Any] = field(default_factory=dict)  # where, when, how many pages
    #: Held work, from the capped crawl: bytes of one live parked job / timer (key + value,
    #: uncompressed) and how many were written per page stored there.
    parked_bytes_per_record: float = 0.0
    timer_bytes_per_record: float = 0.0
    timers_per_page: float = 0.0

    @classmethod
    def load(cls, path: Path = COSTS) -> Costs:
        try:
            data = json.loads(path.read_text())
            held = data["held"]
            return cls(cpu_s=dict(data["cpu_s_per_page"]),
                       topic_bytes=dict(data["topic_bytes_per_page"]),
                       seen_bytes_per_key=float(data["seen_bytes_per_key"]),
                       store_bytes_per_page=float(data["store_bytes_per_page"]),
                       page_bytes=float(data["page_bytes"]), measured=dict(data["measured"]),
                       parked_bytes_per_record=float(held["parked_bytes_per_record"]),
                       timer_bytes_per_record=float(held["timer_bytes_per_record"]),
                       timers_per_page=float(held["timers_per_page"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read the measured costs {path}: {exc} (write them "
                              "with `python -m bench.cost_bench`)") from exc


@dataclass(frozen=True)
class NodeLimits:
    """What one machine of the deployment sustains (inputs, not measured here)."""

    worker_cpu: float = 0.8  # CPU-seconds per second one worker process gets (one core)
    broker_mb_s: float = 100.0  # disk writes one broker sustains, MB/s
    store_mb_s: float = 50.0  # compressed bytes one ClickHouse node ingests, MB/s
    partition_mb_s: float = 5.0  # produce rate one partition is kept under, MB/s
    replication: int = 3
    page_bytes: float | None = None  # mean page body; None: the measured site's
    #: Jobs waiting beyond the workers' memory (parked); None: one day's pages, as when a
    #: day's frontier is published at once.
    backlog: float | None = None
    #: How long a retry waits in a timer at most: Retry-After is honoured up to an hour.
    timer_wait_s: float = 3600.0


@dataclass(frozen=True)
class Plan:
    pages_per_s: float
    partitions: int
    workers: dict[str, int]
    broker_mb_s: float  # written to disk over all brokers (replicas included)
    brokers: int
    seen_gb: float  # local dedupe state over the fetch workers (RocksDB)
    changelog_gb: float  # compacted dedupe changelog on the brokers (replicas included)
    parked_gb: float  # the backlog's parked jobs in the fetch workers' state stores
    parked_changelog_gb: float  # crawl.parked on the brokers (replicas included)
    timers_gb: float  # waiting retries in the retry workers' state stores
    timers_changelog_gb: float  # crawl.timers on the brokers (replicas included)
    store_gb_per_day: float
    store_nodes: int
    politeness_pages_per_s: float  # targets x cap: the most the caps allow
    largest_target_pages_per_day: float  # one target at its cap
    saturates_first: str
    notes: list[str]
    loads: dict[str, float] = field(default_factory=dict)  # share of each resource used


def plan(pages_per_day: float, targets: int, cap: float, costs: Costs,
         limits: NodeLimits = NodeLimits(), seen_ttl_s: float = 7 * DAY_S) -> Plan:
    """The fleet ``pages_per_day`` needs over ``targets`` targets at ``cap`` req/s each."""
    if pages_per_day <= 0 or targets <= 0 or cap <= 0:
        raise ConfigError("pages per day, targets and cap must be > 0")
    rate = pages_per_day / DAY_S
    scale = (limits.page_bytes / costs.page_bytes) if limits.page_bytes else 1.0
    # CPU scales with the bytes a stage handles: those reading or writing pages (fetch,
    # parse and store) with the page size.
    demand = {st: rate * costs.cpu_s.get(st, 0.0) * (scale if handles_pages(st) else 1.0)
              for st in stages()}  # CPU-seconds per second
    workers = {st: max(1, math.ceil(d / limits.worker_cpu)) for st, d in demand.items()}
    topic_mb_s = {t: rate * b * (scale if t in ("fetched", "parsed") else 1.0) / 1e6
                  for t, b in costs.topic_bytes.items()}
    hottest = max(topic_mb_s.values(), default=0.0)
    partitions = max(max(workers.values()), math.ceil(hottest / limits.partition_mb_s), 12)
    written = sum(topic_mb_s.values()) * limits.replication
    brokers = max(limits.replication, math.ceil(written / limits.broker_mb_s))
    keys = pages_per_day * seen_ttl_s / DAY_S
    seen_gb = keys * costs.seen_bytes_per_key / 1e9
    changelog_gb = keys * costs.topic_bytes.get("seen", 0.0) * limits.replication / 1e9
    backlog = pages_per_day if limits.backlog is None else limits.backlog
    parked_gb = backlog * costs.parked_bytes_per_record / 1e9
    timers_gb = rate * costs.timers_per_page * limits.timer_wait_s \
        * costs.timer_bytes_per_record / 1e9
    store_day = pages_per_day * costs.store_bytes_per_page * scale / 1e9
    store_nodes = max(1, math.ceil(store_day * 1e3 / DAY_S / limits.store_mb_s))
    allowed = targets * cap
    loads = {
        "the politeness caps (targets x cap)": rate / allowed,
        "broker disk writes": written / (brokers * limits.broker_mb_s),
        "ClickHouse ingest": store_day * 1e3 / DAY_S / (store_nodes * limits.store_mb_s),
        # a stage with no measured cost (revisit: it runs with revisit policies only) has
        # its one worker and no load to report
        **{f"{st} workers' CPU": demand[st] / (n * limits.worker_cpu)
           for st, n in workers.items() if demand[st] > 0},
    }
    notes = []
    if rate > allowed:
        notes.append(f"the caps allow only {allowed:,.0f} pages/s over {targets:,} targets: "
                     "more targets, or higher caps where sites allow them")
    per_target = rate / targets
    notes.append(f"a target averages {per_target:.4f} req/s against its cap of {cap:g}: "
                 f"one at its cap gives {cap * DAY_S:,.0f} pages a day, so a site with more "
                 "pages than that takes more than a day whatever the fleet's size")
    return Plan(rate, partitions, workers, written, brokers, seen_gb, changelog_gb,
                parked_gb, parked_gb * limits.replication, timers_gb,
                timers_gb * limits.replication, store_day, store_nodes, allowed, cap * DAY_S,
                max(loads, key=loads.__getitem__), notes, loads)


def render(p: Plan, costs: Costs, limits: NodeLimits) -> list[tuple[str, str]]:
    """The plan as (what, figure) rows, with the inputs it rests on."""
    m = costs.measured
    rows = [
        ("pages/s", f"{p.pages_per_s:,.0f}"),
        ("partitions per topic", f"{p.partitions:,}"),
        *((f"{st} workers", f"{n:,}") for st, n in p.workers.items()),
        ("broker disk writes (all replicas)", f"{p.broker_mb_s:,.1f} MB/s"),
        ("brokers", f"{p.brokers:,} (at {limits.broker_mb_s:g} MB/s each)"),
        ("dedupe state, fetch workers' disks", f"{p.seen_gb:,.1f} GB"),
        ("dedupe changelog on the brokers", f"{p.changelog_gb:,.1f} GB"),
        ("parked backlog, fetch workers' disks", f"{p.parked_gb:,.1f} GB"),
        ("parked changelog on the brokers", f"{p.parked_changelog_gb:,.1f} GB"),
        ("timers, retry workers' disks", f"{p.timers_gb:,.2f} GB"),
        ("timers changelog on the brokers", f"{p.timers_changelog_gb:,.2f} GB"),
        ("ClickHouse, compressed", f"{p.store_gb_per_day:,.1f} GB/day"),
        ("ClickHouse nodes (ingest)", f"{p.store_nodes:,} (at {limits.store_mb_s:g} MB/s)"),
        ("the caps allow", f"{p.politeness_pages_per_s:,.0f} pages/s"),
        ("saturates first", p.saturates_first),
        ("load at this size", ", ".join(f"{k} {v:.0%}" for k, v in sorted(
            p.loads.items(), key=lambda kv: -kv[1]))),
        ("measured on", f"{m.get('pages', '?')} pages of {costs.page_bytes:,.0f} B, "
                        f"{m.get('commit', '?')} ({m.get('at', '?')})"),
    ]
    return rows + [("note", n) for n in p.notes]
