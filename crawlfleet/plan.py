"""A capacity plan from measured per-page costs: ``crawlfleet plan --pages-per-day N ...``.

The per-page costs are measured, never guessed: ``python -m bench.cost_bench`` crawls
several site shapes end to end with the default settings and writes ``infra/costs.json``
(CPU seconds per page of each stage and of the broker's JVM, bytes per page written to each
topic and on the broker's wire, bytes per dedupe key and per parked job in the fetch stage's
state on disk, ClickHouse's bytes per page after compression). The file ships in the package
(``infra`` package data, read with :mod:`importlib.resources`), so an installed
``crawlfleet plan`` needs no checkout. This module only does arithmetic on them. What it
cannot measure here -- the size of real pages, the machines of a deployment -- are inputs with
stated defaults (``NodeLimits``), printed beside the plan. Every resource's load is reported
by kind (:data:`KINDS`): the one nearest its limit binds first, and the others' margins say
how much more traffic each takes before it binds too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from schemas.pipeline import PAGE_TOPICS, handles_pages
from schemas.stages import stages

#: The measured costs, from the installed package (a wheel carries them: package data).
COSTS: Traversable = resources.files("infra") / "costs.json"
DAY_S = 86_400
#: The kinds of resource a fleet runs out of, as the plan names them.
KINDS = ("politeness", "CPU", "disk", "network", "broker", "store")


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
    #: A parked job's bytes in the fetch stage's store on disk (RocksDB); None: the
    #: record's bytes (files measured before the store's own size was).
    parked_disk_bytes_per_key: float | None = None
    #: Bytes on the broker's wire per page, one replica: ``in`` produced, ``out`` consumed by
    #: the stage groups. None: every topic's bytes in, each read once.
    wire_in: float | None = None
    wire_out: float | None = None

    @classmethod
    def load(cls, path: Path | Traversable = COSTS) -> Costs:
        try:
            data = json.loads(path.read_text())
            held = data["held"]
            wire = data.get("wire_bytes_per_page", {})
            disk = held.get("parked_disk_bytes_per_key")
            return cls(cpu_s=dict(data["cpu_s_per_page"]),
                       topic_bytes=dict(data["topic_bytes_per_page"]),
                       seen_bytes_per_key=float(data["seen_bytes_per_key"]),
                       store_bytes_per_page=float(data["store_bytes_per_page"]),
                       page_bytes=float(data["page_bytes"]), measured=dict(data["measured"]),
                       parked_bytes_per_record=float(held["parked_bytes_per_record"]),
                       timer_bytes_per_record=float(held["timer_bytes_per_record"]),
                       timers_per_page=float(held["timers_per_page"]),
                       parked_disk_bytes_per_key=None if disk is None else float(disk),
                       wire_in=None if "in" not in wire else float(wire["in"]),
                       wire_out=None if "out" not in wire else float(wire["out"]))
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
    broker_cpu: float = 4.0  # cores one broker's JVM gets
    network_mb_s: float = 1250.0  # one machine's NIC each way (10 Gbit/s), MB/s
    worker_disk_gb: float = 100.0  # the state disk one fetch worker gets, GB
    store_replicas: int = 2  # ClickHouse replicas of each shard


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
    kinds: dict[str, str] = field(default_factory=dict)  # each load's kind (KINDS)
    network_mb_s: tuple[float, float] = (0.0, 0.0)  # into, out of the brokers (all)
    store_replicas: int = 1

    @property
    def binds_first(self) -> str:
        """The kind of resource nearest its limit at this size."""
        return self.kinds.get(self.saturates_first, self.saturates_first)

    def margins(self) -> dict[str, tuple[float, str]]:
        """Every kind's headroom (1 / its highest load - 1: how much more traffic it takes
        before it binds) and the resource that sets it, nearest first."""
        worst: dict[str, tuple[float, str]] = {}
        for name, load in self.loads.items():
            kind = self.kinds.get(name, name)
            if load > 0 and (kind not in worst or load > self.loads[worst[kind][1]]):
                worst[kind] = (1 / load - 1, name)
        return dict(sorted(worst.items(), key=lambda kv: kv[1][0]))


def plan(pages_per_day: float, targets: int, cap: float, costs: Costs,
         limits: NodeLimits = NodeLimits(), seen_ttl_s: float = 7 * DAY_S) -> Plan:
    """The fleet ``pages_per_day`` needs over ``targets`` targets at ``cap`` req/s each.

    Each part is sized to the resource it runs out of first (workers to CPU, fetch workers
    also to their state disk, brokers to disk writes, CPU and network, ClickHouse shards to
    ingest); the loads say how near its limit each resource then is.
    """
    if pages_per_day <= 0 or targets <= 0 or cap <= 0:
        raise ConfigError("pages per day, targets and cap must be > 0")
    rate = pages_per_day / DAY_S
    scale = (limits.page_bytes / costs.page_bytes) if limits.page_bytes else 1.0
    # CPU scales with the bytes a stage handles: those reading or writing pages (fetch,
    # parse and store) with the page size.
    demand = {st: rate * costs.cpu_s.get(st, 0.0) * (scale if handles_pages(st) else 1.0)
              for st in stages()}  # CPU-seconds per second
    workers = {st: max(1, math.ceil(d / limits.worker_cpu)) for st, d in demand.items()}
    topic_mb_s = {t: rate * b * (scale if f"crawl.{t}" in PAGE_TOPICS else 1.0) / 1e6
                  for t, b in costs.topic_bytes.items()}
    produced = sum(topic_mb_s.values())
    # the wire follows the topics' bytes: the measured ratio of consumed to produced
    wire_ratio = (costs.wire_out / costs.wire_in) if costs.wire_in and costs.wire_out \
        else 1.0
    consumed = produced * wire_ratio
    keys = pages_per_day * seen_ttl_s / DAY_S
    seen_gb = keys * costs.seen_bytes_per_key / 1e9
    changelog_gb = keys * costs.topic_bytes.get("seen", 0.0) * limits.replication / 1e9
    backlog = pages_per_day if limits.backlog is None else limits.backlog
    parked_local = costs.parked_disk_bytes_per_key or costs.parked_bytes_per_record
    parked_gb = backlog * parked_local / 1e9
    parked_changelog_gb = backlog * costs.parked_bytes_per_record * limits.replication / 1e9
    timers_gb = rate * costs.timers_per_page * limits.timer_wait_s \
        * costs.timer_bytes_per_record / 1e9
    if "fetch" in workers:  # the dedupe and parked state lives on the fetch workers' disks
        workers["fetch"] = max(workers["fetch"],
                               math.ceil((seen_gb + parked_gb) / limits.worker_disk_gb))
    hottest = max(topic_mb_s.values(), default=0.0)
    partitions = max(max(workers.values()), math.ceil(hottest / limits.partition_mb_s), 12)
    written = produced * limits.replication
    # into the brokers: producers plus followers' copies; out: consumers plus the copies
    net_in = written
    net_out = consumed + produced * (limits.replication - 1)
    broker_cpu = rate * costs.cpu_s.get("broker", 0.0) * scale * limits.replication
    brokers = max(limits.replication, math.ceil(written / limits.broker_mb_s),
                  math.ceil(broker_cpu / limits.broker_cpu),
                  math.ceil(max(net_in, net_out) / limits.network_mb_s))
    store_day = pages_per_day * costs.store_bytes_per_page * scale / 1e9
    ingest = store_day * 1e3 / DAY_S  # MB/s into every replica of the store
    store_nodes = max(1, math.ceil(ingest / limits.store_mb_s))
    allowed = targets * cap
    fetch_in = rate * costs.page_bytes * scale / 1e6  # page bodies from the sites
    fetch_out = topic_mb_s.get("fetched", 0.0)
    loads = {
        "the politeness caps (targets x cap)": rate / allowed,
        "broker disk writes": written / (brokers * limits.broker_mb_s),
        "broker CPU": broker_cpu / (brokers * limits.broker_cpu),
        "broker network": max(net_in, net_out) / (brokers * limits.network_mb_s),
        "ClickHouse ingest": ingest / (store_nodes * limits.store_mb_s),
        # a stage with no measured cost (revisit: it runs with revisit policies only) has
        # its one worker and no load to report
        **{f"{st} workers' CPU": demand[st] / (n * limits.worker_cpu)
           for st, n in workers.items() if demand[st] > 0},
    }
    kinds = {"the politeness caps (targets x cap)": "politeness", "broker disk writes":
             "broker", "broker CPU": "broker", "broker network": "network",
             "ClickHouse ingest": "store", **{f"{st} workers' CPU": "CPU" for st in workers}}
    if "fetch" in workers:
        n = workers["fetch"]
        loads["fetch workers' state disk"] = (seen_gb + parked_gb) / (n * limits.worker_disk_gb)
        loads["fetch workers' network"] = max(fetch_in, fetch_out) / (n * limits.network_mb_s)
        kinds |= {"fetch workers' state disk": "disk", "fetch workers' network": "network"}
    notes = []
    if rate > allowed:
        notes.append(f"the caps allow only {allowed:,.0f} pages/s over {targets:,} targets: "
                     "more targets, or higher caps where sites allow them")
    per_target = rate / targets
    notes.append(f"a target averages {per_target:.4f} req/s against its cap of {cap:g}: "
                 f"one at its cap gives {cap * DAY_S:,.0f} pages a day, so a site with more "
                 "pages than that takes more than a day whatever the fleet's size")
    return Plan(rate, partitions, workers, written, brokers, seen_gb, changelog_gb,
                parked_gb, parked_changelog_gb, timers_gb,
                timers_gb * limits.replication, store_day, store_nodes, allowed, cap * DAY_S,
                max(loads, key=loads.__getitem__), notes, loads, kinds, (net_in, net_out),
                limits.store_replicas)


def margin_text(p: Plan) -> str:
    """The other kinds, nearest their limit first, with the traffic each takes before it
    binds too: ``broker 87% (broker CPU: binds at 1.15x)``."""
    def times(x: float) -> str:
        return f"{x:.2f}x" if x < 10 else f"{x:,.0f}x"

    return ", ".join(f"{kind} {p.loads[name]:.0%} ({name}: binds at {times(1 + m)})"
                     for kind, (m, name) in p.margins().items() if kind != p.binds_first)


def render(p: Plan, costs: Costs, limits: NodeLimits) -> list[tuple[str, str]]:
    """The plan as (what, figure) rows, with the inputs it rests on."""
    m = costs.measured
    shapes = ", ".join(m.get("shapes", [])) or f"{m.get('pages', '?')} pages"
    rows = [
        ("pages/s", f"{p.pages_per_s:,.0f}"),
        ("partitions per topic", f"{p.partitions:,}"),
        *((f"{st} workers", f"{n:,}") for st, n in p.workers.items()),
        ("broker disk writes (all replicas)", f"{p.broker_mb_s:,.1f} MB/s"),
        ("broker network in / out (all)", f"{p.network_mb_s[0]:,.1f} / "
                                          f"{p.network_mb_s[1]:,.1f} MB/s"),
        ("brokers", f"{p.brokers:,} (at {limits.broker_mb_s:g} MB/s disk, "
                    f"{limits.broker_cpu:g} cores, {limits.network_mb_s:g} MB/s NIC each)"),
        ("dedupe state, fetch workers' disks", f"{p.seen_gb:,.1f} GB"),
        ("dedupe changelog on the brokers", f"{p.changelog_gb:,.1f} GB"),
        ("parked backlog, fetch workers' disks", f"{p.parked_gb:,.1f} GB"),
        ("parked changelog on the brokers", f"{p.parked_changelog_gb:,.1f} GB"),
        ("timers, retry workers' disks", f"{p.timers_gb:,.2f} GB"),
        ("timers changelog on the brokers", f"{p.timers_changelog_gb:,.2f} GB"),
        ("ClickHouse, compressed", f"{p.store_gb_per_day:,.1f} GB/day per replica "
                                   f"({p.store_gb_per_day * p.store_replicas:,.1f} all)"),
        ("ClickHouse nodes (ingest)", f"{p.store_nodes:,} shards x {p.store_replicas} "
                                      f"replicas (at {limits.store_mb_s:g} MB/s)"),
        ("the caps allow", f"{p.politeness_pages_per_s:,.0f} pages/s"),
        ("binds first", f"{p.binds_first}: {p.saturates_first} at "
                        f"{p.loads[p.saturates_first]:.0%}"),
        ("margin of the others", margin_text(p)),
        ("saturates first", p.saturates_first),
        ("load at this size", ", ".join(f"{k} {v:.0%}" for k, v in sorted(
            p.loads.items(), key=lambda kv: -kv[1]))),
        ("measured on", f"{shapes} ({m.get('pages', '?')} pages of "
                        f"{costs.page_bytes:,.0f} B), {m.get('commit', '?')} "
                        f"({m.get('at', '?')})"),
    ]
    if "machine" in m:
        rows.append(("measured where", str(m["machine"])))
    return rows + [("note", n) for n in p.notes]
