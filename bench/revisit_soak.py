"""Long-running mode (issue 45.6): a deployed fleet revisiting a site without end, its memory
and its state cycle after cycle.

    python -m bench.revisit_soak [--hosts 8] [--pages 6] [--interval 6] [--cycles 12]
                                 [--port 28792] [--short-horizon]

Deployed as README's cluster section says (topics made, one worker per stage and the
quarantine app, ``revisit = "every Ns"``), on a broker of the benchmark's own (a fresh home in
a temporary directory), at the default politeness (2 requests/s a target), over ``--hosts``
loopback sites (:class:`sites.changing_site.ChangingSite`) of ``--pages`` pages each, whose
pages answer with an ETag, a Last-Modified, neither, or print the time they were served; a
fifth of them change every cycle. Time is compressed, not simulated: timers fire on the
broker's clock, which nothing can speed up, so an interval of seconds stands for hours (the
policies' arithmetic over long spans is ``tests/unit/test_revisit_policy.py``'s).

Cycle k ends when every page's visit k is stored. For each it prints:

- visits: made (visit k stored) beside due (visit k-1 planned one), the site's requests in
  the cycle, and how late the visits came (p50/max of visited_at minus the next_due_at of
  the visit before, as the ``revisits`` view counts it);
- memory: RSS and PSS of every worker and of the broker (``/proc/<pid>/smaps_rollup``);
- state: the revisit timers (the stage's gauge; the live keys and bytes of their changelog
  as the broker holds them, which a restore rebuilds; the RocksDB directory), the seen store
  (the same for ``crawl.seen``), the parked jobs, the fetch stage's per-target state (its
  gauges: scheduler slots, robots rules, Crawl-delays remembered, adaptive health), and the
  store (page_visits rows and chDB's directory: the history, which grows by design).

Then the change of each from cycle 2 (warmed up) to the last, per cycle.

``--short-horizon`` compresses the dedupe horizon with the interval (one attempt, a 6 s
lease: ``dedupe_horizon_s`` 6 s, not the default 2 h 5 min), so the seen store's pruning of
earlier visits' keys (``consumers.fetch.visit_prune``) shows within the run: at the default
horizon, seconds-apart visits are all younger than it and every key is rightly kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from core.config import Settings, load_settings
from core.urls import canonicalize
from crawlfleet.crawl import wait_ready
from crawlfleet.fleet import Fleet, Plan
from infra import kafka_local
from infra.store_query import run_query
from infra.topics import create_topics, topology_of
from infra.views import expand, load_views
from producers.frontier import publish
from sites.changing_site import MODES, ChangingSite
from sites.demo_server import free_port
from streams.status import read_statuses

#: ``--short-horizon``: one attempt (no retry horizon) and a 6 s lease, the broker's least.
SHORT_HORIZON: dict[str, Any] = {"max_attempts": 1, "session_timeout_ms": 6000,
                                 "max_poll_interval_ms": 6000}
#: The fetch stage's gauges of per-target state (``TargetPolicy.memory_counts``).
TARGET_GAUGES = ("target_slots", "robots_rules", "robots_intervals", "target_health")


@dataclass
class Cycle:
    """What one revisit cycle measured."""

    n: int
    at_s: float
    due: int
    made: int
    requests: int
    late_p50_s: float | None
    late_max_s: float | None
    due_now: int
    memory: dict[str, tuple[int, int]] = field(default_factory=dict)  # proc: (RSS, PSS) kB
    state: dict[str, int] = field(default_factory=dict)  # figure: value


# --- what the machine says ------------------------------------------------------------------


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of ``pid`` in kB; (0, 0) if it is gone."""
    out = {"Rss": 0, "Pss": 0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in out:
                out[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out["Rss"], out["Pss"]


def disk_bytes(path: Path, suffix: str = "") -> int:
    """Bytes of the files under ``path`` whose names end with ``suffix`` (0 if none)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            if f.endswith(suffix):
                with suppress(OSError):
                    total += (Path(root) / f).stat().st_size
    return total


def changelog(s: Settings, topic: str, timeout_s: float = 20.0) -> tuple[int, int, int]:
    """(live keys, their key + value bytes, records appended) of ``topic``, read committed
    from its start to its end: the state a restore of it rebuilds."""
    c = Consumer({**s.kafka_common(), "group.id": f"soak-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "isolation.level": "read_committed",
                  "enable.partition.eof": True})
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts}
        todo = {p for p in parts if ends[p] > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        live: dict[tuple[int, bytes], int] = {}
        records = 0
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                continue
            records += 1
            key, value = msg.key() or b"", msg.value()
            place = (int(msg.partition() or 0), key)
            if value is None:
                live.pop(place, None)
            else:
                live[place] = len(key) + len(value)
        return len(live), sum(live.values()), records
    finally:
        c.close()


def gauges(s: Settings) -> dict[str, dict[str, Any]]:
    """Each worker's status gauges, by worker id."""
    return {str(st.get("worker")): dict(st.get("gauges") or {})
            for st in read_statuses(s.status_dir)}


def rows(s: Settings, sql: str) -> list[list[Any]]:
    return run_query(s, sql)[1]


# --- the crawl ------------------------------------------------------------------------------


class Soak:
    """The fleet, its sites and what each cycle measured."""

    def __init__(self, s: Settings, fleet: Fleet, sites: list[ChangingSite],
                 broker: list[int], kafka_home: Path) -> None:
        self.s, self.fleet, self.sites, self.broker = s, fleet, sites, broker
        self.kafka_home = kafka_home
        self.topo = topology_of(s)
        self.pages = [(site, path) for site in sites for path in site.pages]
        self.began = time.monotonic()
        self._requests = 0

    def requests(self) -> int:
        return sum(site.count(path) for site, path in self.pages)

    def stored(self, visit: int) -> int:
        return int(rows(self.s, f"SELECT count() FROM page_visits_v WHERE visit = {visit}")[0][0])

    def wait_cycle(self, k: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.stored(k) < len(self.pages):
            if time.monotonic() > deadline:
                raise TimeoutError(f"visit {k} of every page not stored in {timeout_s:.0f} s "
                                   f"({self.stored(k)} of {len(self.pages)})")
            time.sleep(0.3)

    def change(self, k: int) -> None:
        """A fifth of the pages change before their next visit (a different fifth each
        cycle)."""
        for i, (site, path) in enumerate(self.pages):
            if i % 5 == k % 5:
                site.change(path)

    def measure(self, k: int) -> Cycle:
        made = self.stored(k)
        due = len(self.pages) if k == 0 else int(rows(
            self.s, f"SELECT countIf(next_due_at > toDateTime64(0, 3, 'UTC')) "
                    f"FROM page_visits_v WHERE visit = {k - 1}")[0][0])
        late: list[Any] = [None, None]
        if k > 0:
            late = rows(self.s, f"""
                SELECT round(quantileExact(0.5)(l), 3), round(max(l), 3) FROM (
                    SELECT dateDiff('millisecond', p.next_due_at, c.visited_at) / 1000 AS l
                    FROM (SELECT dedupe_key, visited_at FROM page_visits_v
                          WHERE visit = {k}) AS c
                    INNER JOIN (SELECT dedupe_key, next_due_at FROM page_visits_v
                                WHERE visit = {k - 1}) AS p USING (dedupe_key))""")[0]
        view = rows(self.s, "SELECT sum(due_now) FROM (" + _revisits_view() + ")")
        now = self.requests()
        cycle = Cycle(k, time.monotonic() - self.began, due, made, now - self._requests,
                      late[0], late[1], int(view[0][0] or 0) if view else 0)
        self._requests = now
        for wid, proc in sorted(self.fleet.procs.items()):
            cycle.memory[wid] = memory_kb(proc.pid)
        for i, pid in enumerate(self.broker):
            cycle.memory[f"broker-{i}"] = memory_kb(pid)
        cycle.state = self.state()
        return cycle

    def state(self) -> dict[str, int]:
        g = gauges(self.s)
        fetch = {k: int(v) for w, gs in g.items() if w.startswith("fetch")
                 for k, v in gs.items() if isinstance(v, int)}
        revisit = next((gs for w, gs in g.items() if w.startswith("revisit")), {})
        out = {"timers_gauge": int(revisit.get("timers_planned", 0)),
               "seen_gauge": fetch.get("seen_keys", 0), "parked_gauge": fetch.get("parked", 0),
               **{k: fetch.get(k, 0) for k in TARGET_GAUGES}}
        for name, topic in (("timers", f"{self.topo.prefix}crawl.revisit.timers"),
                            ("seen", self.topo.seen), ("parked", f"{self.topo.prefix}crawl.parked"),
                            ("retry_timers", f"{self.topo.prefix}crawl.timers")):
            keys, size, records = changelog(self.s, topic)
            out |= {f"{name}_keys": keys, f"{name}_bytes": size, f"{name}_records": records,
                    # the segments' records (its indexes are preallocated, sparse)
                    f"{name}_log": sum(disk_bytes(d, ".log") for d in
                                       self.kafka_home.glob(f"node-*/data/{topic}-*"))}
        data = self.s.data_dir
        out |= {"timers_disk": disk_bytes(data / "due"), "seen_disk": disk_bytes(data / "seen"),
                "store_disk": disk_bytes(self.s.clickhouse_path),
                "visit_rows": int(rows(self.s, "SELECT count() FROM page_visits_v")[0][0])}
        return out


def _revisits_view() -> str:
    """The ``revisits`` view, as the dashboard runs it (the last hour)."""
    return expand(load_views()["revisits"].sql, 3600)


# --- printing -------------------------------------------------------------------------------


def _mb(kb: int) -> str:
    return f"{kb / 1024:.0f}"


def _kb(b: int) -> str:
    return f"{b / 1024:.1f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def show(c: Cycle) -> list[str]:
    st = c.state
    mem = "  ".join(f"{w} {_mb(r)}/{_mb(p)}" for w, (r, p) in c.memory.items())
    return [
        f"cycle {c.n:>2} at {c.at_s:6.1f} s: visits made {c.made} / due {c.due}, requests "
        f"{c.requests}; late p50 {_s(c.late_p50_s)} s, max {_s(c.late_max_s)} s; due now "
        f"(view) {c.due_now}",
        f"  memory MB RSS/PSS: {mem}",
        f"  timers: gauge {st['timers_gauge']}, changelog {st['timers_keys']} live keys "
        f"{_kb(st['timers_bytes'])} KB of {st['timers_records']} records "
        f"({_kb(st['timers_log'])} KB on the broker), RocksDB {_kb(st['timers_disk'])} KB",
        f"  seen: gauge {st['seen_gauge']}, changelog {st['seen_keys']} live keys "
        f"{_kb(st['seen_bytes'])} KB of {st['seen_records']} records "
        f"({_kb(st['seen_log'])} KB on the broker), RocksDB {_kb(st['seen_disk'])} KB",
        f"  parked {st['parked_keys']} live, retry timers {st['retry_timers_keys']} live | "
        f"per target: slots {st['target_slots']}, robots rules {st['robots_rules']}, "
        f"crawl-delays {st['robots_intervals']}, health {st['target_health']} | store: "
        f"{st['visit_rows']} visit rows, disk {_kb(st['store_disk'])} KB",
    ]


def growth(cycles: list[Cycle], start: int = 2) -> list[str]:
    """Each figure's change per cycle from cycle ``start`` to the last (least squares)."""
    span = [c for c in cycles if c.n >= start]
    if len(span) < 2:
        return []
    xs = [float(c.n) for c in span]

    def slope(ys: list[float]) -> float:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / \
            sum((x - mx) ** 2 for x in xs)

    out = [f"change per cycle, cycle {start} to {span[-1].n} (least-squares slope):"]
    mem = ", ".join(f"{w} {slope([c.memory[w][0] for c in span]):+.0f}/"
                    f"{slope([c.memory[w][1] for c in span]):+.0f}" for w in span[0].memory)
    out.append(f"  memory kB RSS/PSS: {mem}")
    for label, names in GROWTH:
        out.append(f"  {label}: " + ", ".join(
            f"{n} {slope([float(c.state[k]) for c in span]):+.1f}" for n, k in names))
    return out


#: The state figures :func:`growth` reports, by kind: (label, state key).
GROWTH = (
    ("revisit timers", (("live keys", "timers_keys"), ("live bytes", "timers_bytes"),
                        ("changelog records", "timers_records"),
                        ("broker bytes", "timers_log"), ("RocksDB bytes", "timers_disk"))),
    ("seen store", (("live keys", "seen_keys"), ("live bytes", "seen_bytes"),
                    ("broker bytes", "seen_log"), ("RocksDB bytes", "seen_disk"))),
    ("per target", (("slots", "target_slots"), ("robots rules", "robots_rules"),
                    ("crawl-delays", "robots_intervals"), ("health", "target_health"),
                    ("parked", "parked_keys"), ("retry timers", "retry_timers_keys"))),
    ("store (history)", (("visit rows", "visit_rows"), ("chDB bytes", "store_disk"))),
)


# --- running it -----------------------------------------------------------------------------


@contextmanager
def _sites(hosts: int, pages: int) -> Iterator[list[ChangingSite]]:
    names = [f"127.0.0.{41 + i}" for i in range(hosts)]
    port = free_port(names, 18790)
    with ExitStack() as stack:
        sites = [ChangingSite(h, port) for h in names]
        for site in sites:
            stack.enter_context(site)
            for j in range(pages):
                site.add(f"/p{j}", MODES[j % len(MODES)])
        yield sites


def run(args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> list[Cycle]:
    home = work / "kafka"
    bootstrap = kafka_local.up(nodes=1, base_dir=home, base_port=args.port, heap_mb=512)
    broker = [n.pid for n in kafka_local.status(home).nodes if n.pid is not None]
    try:
        s = load_settings(bootstrap_servers=bootstrap, topic_prefix="soak.",
                          data_dir=work / "data", allow_private=True,
                          revisit=f"every {args.interval:g}s",
                          **(SHORT_HORIZON if args.short_horizon else {}))
        create_topics(s)
        fleet = Fleet(s, Plan(), work / "logs")
        fleet.start()
        try:
            if not wait_ready(s, fleet, 180):
                raise TimeoutError("the fleet did not join")
            with _sites(args.hosts, args.pages) as sites:
                soak = Soak(s, fleet, sites, broker, home)
                publish([canonicalize(site.url(p)) for site, p in soak.pages], s)
                cycles: list[Cycle] = []
                for k in range(args.cycles + 1):
                    soak.wait_cycle(k, 60 + 10 * args.interval)
                    fleet.heal()
                    cycles.append(soak.measure(k))
                    for line in show(cycles[-1]):
                        say(line)
                    soak.change(k)
                if fleet.restarts:
                    say(f"note: {fleet.restarts} worker restarts")
                return cycles
        finally:
            fleet.stop()
    finally:
        kafka_local.down(home)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=8, help="loopback sites (targets)")
    p.add_argument("--pages", type=int, default=6, help="pages a site")
    p.add_argument("--interval", type=float, default=6.0, help="seconds between visits")
    p.add_argument("--cycles", type=int, default=12, help="revisit cycles after the first")
    p.add_argument("--port", type=int, default=28792, help="the broker's base port")
    p.add_argument("--short-horizon", action="store_true",
                   help="a 6 s dedupe horizon (one attempt, a 6 s lease), compressed as time is")
    args = p.parse_args(argv)
    os.environ.setdefault(kafka_local.JARS_ENV, str(kafka_local.ensure_jars()))
    with tempfile.TemporaryDirectory(prefix="crawlfleet-soak-") as tmp:
        cycles = run(args, Path(tmp), lambda line: print(line, flush=True))
    for line in growth(cycles):
        print(line)
    print(f"{args.hosts * args.pages} pages on {args.hosts} targets, every "
          f"{args.interval:g} s{', dedupe horizon 6 s' if args.short_horizon else ''}; "
          f"load average {os.getloadavg()[0]:.1f} (a shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
