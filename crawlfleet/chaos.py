"""The chaos proof: crawl a local site while SIGKILLing random workers (and a broker).

``run_chaos`` starts its own Kafka (1 node, or 3 with one hard-killed and restarted
mid-crawl), serves the generated bench site on loopback, runs every stage as its own process
through :class:`crawlfleet.crawl.Fleet`, publishes the seeds, and then every ``kill_every_s``
seconds sends SIGKILL to a randomly chosen worker (seeded schedule), which the fleet restarts
with the same worker id. When the crawl is nearly done it stops killing, waits for the
pipeline to drain, and audits the result against what a correct crawler must store:

* ``lost``: expected URLs not in the store;
* ``stored_duplicates``: rows FINAL does not collapse (count - uniqExact(url)) plus committed
  duplicates in the raw ``crawl.parsed`` topic, read ``read_committed`` (a dedupe key that
  appears twice there is a result downstream would have seen twice);
* the fetch over-apply ratio: page requests the site received ÷ distinct pages. A kill
  redoes the work in flight at that moment, so the ratio is judged against a bound built
  from the in-flight gauges the workers reported around each kill (see
  :func:`exposure_window_s`).

It also measures what the churn costs in pace (issue 11, "measured, not assumed"). Unless
``baseline=False``, the same fleet crawls a fresh instance of the same site shape a second
time on its own topic prefix, with the kill schedule running but no signal sent, and the
report compares the two over their *kill phase*:

* the kill phase runs from the first kill to the last one. The baseline draws the same
  seeded schedule and stops it by the same rule (:data:`KILL_UNTIL_PROGRESS` of the pages
  requested, or ``kill_for_s``), so its phase is the same span of the same crawl, at the pace
  the fleet keeps when nobody is killed. Taking the kill run's offsets instead would judge a
  slow kill run against baseline seconds after the baseline had finished;
* pages stored per second = pages whose first row in the store carries a ``stored_at`` (the
  store's insert time, ``now64(3)`` on this machine's clock) inside the phase, ÷ the phase's
  length. Row timestamps cost the crawl nothing and are exact to the millisecond, where
  sampling the store while it works would load it and blur the phase's edges; a replay of an
  already stored page does not count twice (its first row does);
* retention = kill-phase pages/s ÷ baseline pages/s; the target is :data:`RETENTION_TARGET`;
* drain = last kill → drained, for both (the baseline's from its last scheduled kill, so the
  two say what recovery costs beyond the tail every crawl has).

The kill run goes first, on a fresh broker: whatever a cold JVM costs falls on it, so the
order can only understate retention, never flatter it. Each run waits until every group is
stable before it publishes, so the phase measures churn, not start-up.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    TopicPartition,
)
from rich.console import Console
from rich.table import Table

from consumers.runtime import holds_work, read_statuses
from crawlfleet.config import Settings
from crawlfleet.crawl import IDLE_S, Fleet, Plan, _calm, wait_ready
from crawlfleet.errors import InfraError
from infra import kafka_local
from infra.clickhouse import PORT_FILE, run_query
from infra.demo_site import DemoSite, bench_spec, free_port
from infra.kafka_io import topology_of
from infra.lag import LagProbe
from infra.topics import create_topics
from producers.frontier import PublishReport, jobs_from_lines, publish

# Below Linux's ephemeral range (32768-60999): a client reconnecting to a killed broker's port
# can be handed that very port as its own source port (a self-connect) and hold it, so the
# broker could not bind it again on restart.
BASE_PORT = {1: 21092, 3: 21192}
SITE_HOSTS = 8
BROKER_VICTIM = 2
BROKER_DOWN_S = 10.0
#: The broker goes down once this share of the expected pages has been requested.
BROKER_KILL_AT_PROGRESS = 0.2
#: Stop killing once this share of the expected pages has been requested: the tail of the
#: crawl then drains without chaos, so "drained" measures recovery, not luck.
KILL_UNTIL_PROGRESS = 0.9
#: A restarted worker's process start-up plus its join, on a loaded two-core machine.
RESTART_ALLOWANCE_S = 10.0
#: Rebalances one fetch kill can cause before static membership: the replacement joins as a
#: new member, and the dead one leaves when its session expires (see exposure_window_s).
REBALANCES_PER_FETCH_KILL = 2
#: Kill-phase pages/s ÷ the no-kill rate the fleet must keep (issue 11).
RETENTION_TARGET = 0.8
TICK_S = 0.5
CHAOS_CRAWL_S = 60.0
MIN_RATE_CAP, MAX_RATE_CAP = 2.0, 500.0


def exposure_window_s(session_timeout_ms: int) -> float:
    """How long after a fetch kill a rebalance can still drop fetch work in flight.

    The victim is restarted at once under the same worker id (``Fleet.heal``). With static
    membership (``group.instance.id`` = the worker id) the replacement takes the victim's
    place and its partitions back with no rebalance; only the victim's own work in flight is
    redone. Without it, the replacement joins as a new member, and the coordinator drops the
    dead member only when its session expires, up to one session timeout after the kill:
    both rebalances (or one that waits for the expiry) fall within the session timeout plus
    the replacement's start-up and join. Every fetch worker can lose what it holds at each of
    them, so a fetch kill may make the fleet redo its own victim's load plus
    :data:`REBALANCES_PER_FETCH_KILL` times the most the fleet held within this window:
    a bound that holds with or without static membership (with it, a loose one).
    """
    return session_timeout_ms / 1000.0 + RESTART_ALLOWANCE_S


@dataclass
class Kill:
    """One SIGKILL of a worker, with what it and the fetch fleet held just before."""

    at_s: float
    worker: str
    stage: str
    pid: int
    wall: float  # time.time() of the kill, to line up with logs and record timestamps
    inflight: int  # the victim's in-flight gauge just before the kill
    queued: int  # the victim's queued gauge just before the kill
    #: Largest in-flight + queued over all fetch workers from the kill until the rebalance it
    #: causes is over (fetch kills only): every fetch worker may drop and redo that much.
    fetch_exposure: int = 0


@dataclass
class BrokerKill:
    node: int
    at_s: float
    restarted_at_s: float | None = None
    error: str = ""
    fetch_exposure: int = 0


@dataclass
class Phase:
    """Stored-page pace of one crawl over its kill phase (first kill → last kill)."""

    kills: int  # kills (in the baseline: scheduled kill times) that bound the phase
    start_s: float  # the phase, in seconds from the seeds' publication
    end_s: float
    pages: int  # pages first stored inside the phase
    pages_per_s: float
    crawl_pages_per_s: float  # all pages stored ÷ publish → last page stored
    drain_s: float  # last kill → drained (0 if it did not drain)
    drained: bool
    lost: int

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


def kill_window(kill_walls: list[float]) -> tuple[float, float] | None:
    """The kill phase from the kills' wall times: first → last, or None below two kills."""
    if len(kill_walls) < 2:
        return None
    start, end = min(kill_walls), max(kill_walls)
    return (start, end) if end > start else None


def pages_in_window(first_stored: list[float], start: float, end: float) -> tuple[int, float]:
    """(pages, pages/s) of the first-stored times that fall in ``[start, end)``."""
    if end <= start:
        return 0, 0.0
    n = sum(1 for t in first_stored if start <= t < end)
    return n, n / (end - start)


def retention_of(kill_phase: Phase | None, baseline: Phase | None) -> float | None:
    """Kill-phase pages/s ÷ the baseline's, or None when either is missing or empty."""
    if kill_phase is None or baseline is None or baseline.pages_per_s <= 0:
        return None
    return kill_phase.pages_per_s / baseline.pages_per_s


@dataclass
class ChaosReport:
    pages: int
    nodes: int
    fetch_workers: int
    parse_workers: int
    kill_every_s: float
    seed: int
    rate_cap: float  # requests/s per host
    topic_prefix: str
    pages_expected: int
    pages_stored: int  # count() FROM pages FINAL
    distinct_urls: int  # uniqExact(url) FROM pages FINAL
    raw_rows: int  # count() FROM pages (replays not yet collapsed)
    dead_lettered: int
    dead_by_reason: dict[str, int]
    lost: int  # expected URLs not stored
    lost_sample: list[str]
    unexpected_pages: int  # stored URLs a correct crawler would not store
    wrong_status: int  # stored with a status other than the expected one
    final_duplicates: int  # count FINAL - uniqExact(url)
    committed_duplicates: int  # extra committed records per dedupe key in crawl.parsed
    parsed_records: int  # committed records read from crawl.parsed
    stored_duplicates: int  # final_duplicates + committed_duplicates
    page_requests: int  # requests the site received, robots.txt excluded
    distinct_requested: int  # distinct page URLs requested
    robots_requests: int
    over_apply_ratio: float  # page_requests / distinct_requested
    inflight_at_kills: int  # Σ victim in-flight + queued at kill
    fetch_exposure: int  # Σ fetch-fleet in-flight + queued around fetch and broker kills
    over_apply_bound: float  # 1 + fetch_exposure / distinct_requested
    kills: list[Kill]
    broker_kills: list[BrokerKill]
    restarts: int
    seconds: float  # wall time: infra start-up to the audit
    crawl_seconds: float  # seeds published to drained
    drain_seconds: float  # last kill (or broker restart) to drained
    drained: bool
    notes: list[str] = field(default_factory=list)
    hosts: int = SITE_HOSTS
    session_timeout_s: float = 0.0
    exposure_window_s: float = 0.0
    kill_phase: Phase | None = None  # this run's pace over first kill → last kill
    baseline: Phase | None = None  # the same fleet, site shape and schedule, nobody killed

    @property
    def retention(self) -> float | None:
        return retention_of(self.kill_phase, self.baseline)

    @property
    def retains_pace(self) -> bool:
        return self.retention is not None and self.retention >= RETENTION_TARGET

    @property
    def meets_target(self) -> bool:
        """Issue 11's target: correct, within the over-apply bound, and the pace retained."""
        return self.ok and self.within_bound and self.retains_pace

    @property
    def kills_by_stage(self) -> dict[str, int]:
        return dict(collections.Counter(k.stage for k in self.kills))

    @property
    def within_bound(self) -> bool:
        return self.over_apply_ratio <= self.over_apply_bound + 1e-9

    @property
    def ok(self) -> bool:
        return self.drained and self.lost == 0 and self.stored_duplicates == 0


def run_chaos(pages: int, nodes: int, fetch_workers: int, parse_workers: int,
              kill_every_s: float, seed: int, data_dir: Path | None, timeout_s: float,
              console: Console, *, rate_cap: float | None = None, hosts: int = SITE_HOSTS,
              partitions: int = 12, baseline: bool = True,
              kill_for_s: float | None = None) -> ChaosReport:
    """Crawl ``pages`` local pages on ``hosts`` hosts under worker kills (and a broker kill
    with 3 nodes), then (``baseline``) the same shape again with nobody killed.

    ``rate_cap`` (requests/s per host) defaults to a pace that makes the crawl last about
    :data:`CHAOS_CRAWL_S` (or a dozen kill intervals): unpaced, a CPU-bound crawl of a few
    thousand local pages is over after a handful of kills. Kills stop once
    :data:`KILL_UNTIL_PROGRESS` of the pages were requested, or after ``kill_for_s``.
    Sessions keep the settings' default timeout, as a deployment's do.
    """
    if nodes not in BASE_PORT:
        raise InfraError(f"nodes must be 1 or 3, not {nodes}")
    if kill_every_s <= 0:
        raise InfraError("kill_every_s must be > 0")
    if kill_for_s is not None and kill_for_s <= 0:
        raise InfraError("kill_for_s must be > 0")
    began = time.monotonic()
    temp = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="crawlfleet-chaos-")) if data_dir is None \
        else Path(data_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    kafka_home = root / f"kafka-{nodes}"
    saved_jars = os.environ.get(kafka_local.JARS_ENV)
    cap = rate_cap or paced_rate_cap(pages, kill_every_s, hosts)
    try:
        if not saved_jars:
            os.environ[kafka_local.JARS_ENV] = str(kafka_local.ensure_jars())
        console.print(f"[bold]chaos[/bold]: starting a {nodes}-node Kafka in {kafka_home}")
        _await_ports(BASE_PORT[nodes], nodes)
        bootstrap = kafka_local.up(nodes=nodes, base_dir=kafka_home,
                                   base_port=BASE_PORT[nodes])

        def crawl(chaos: bool) -> ChaosReport:
            prefix = f"chaos{int(time.time())}{uuid.uuid4().hex[:6]}."
            spec = bench_spec(free_port(tuple(f"127.0.0.{2 + k}" for k in range(hosts)),
                                        18900), pages=pages, hosts=hosts)
            seeds = spec.seeds()
            settings = Settings(
                bootstrap_servers=bootstrap, data_dir=root / "runs" / prefix.rstrip("."),
                topic_prefix=prefix, partitions=partitions,
                replication=3 if nodes == 3 else 1, allow_private=True, scope="seeds",
                rate_cap=cap)
            settings = settings.replace(allowed_targets=_seed_targets(seeds, settings))
            with DemoSite(spec) as site:
                return _Run(settings, spec.expected(), seeds, site, kafka_home,
                            Plan(fetch_workers=fetch_workers, parse_workers=parse_workers),
                            kill_every_s, seed, timeout_s, console, began,
                            dict(pages=pages, nodes=nodes, hosts=hosts), chaos=chaos,
                            kill_for_s=kill_for_s).execute()

        report = crawl(chaos=True)
        if baseline:
            console.print("[bold]baseline[/bold]: the same fleet on a fresh site of the same "
                          "shape, the same kill schedule, no kills")
            base = crawl(chaos=False)
            report.baseline = base.kill_phase
            if not base.ok:
                report.notes.append(f"the baseline itself was not clean: drained "
                                    f"{base.drained}, lost {base.lost}, duplicates "
                                    f"{base.stored_duplicates}")
            if report.baseline is None:
                report.notes.append("the baseline had under two scheduled kills: no phase")
        report.seconds = round(time.monotonic() - began, 1)
        return report
    finally:
        try:
            kafka_local.down(kafka_home)
        finally:
            if not saved_jars:
                os.environ.pop(kafka_local.JARS_ENV, None)
            if temp:
                shutil.rmtree(root, ignore_errors=True)


def paced_rate_cap(pages: int, kill_every_s: float, hosts: int = SITE_HOSTS) -> float:
    """Per-host cap under which ``pages`` take about max(CHAOS_CRAWL_S, 12 kills)."""
    seconds = max(CHAOS_CRAWL_S, 12 * kill_every_s)
    return min(MAX_RATE_CAP, max(MIN_RATE_CAP, pages / (hosts * seconds)))


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((kafka_local.HOST, port))
        except OSError:
            return False
    return True


def _await_ports(base_port: int, nodes: int, timeout_s: float = 75.0) -> None:
    """Wait out sockets that merely linger on the cluster's ports (TIME_WAIT lasts 60 s).

    The fixed ports lie in Linux's ephemeral range, so a closed connection of any local
    client can hold one for a minute; a real listener is left for ``kafka_local.up`` to
    report.
    """
    ports = [kafka_local.broker_port(base_port, n) + k for n in range(1, nodes + 1)
             for k in (0, 1)]
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while not _bindable(port) and time.monotonic() < deadline:
            with contextlib.suppress(OSError), \
                    socket.create_connection((kafka_local.HOST, port), timeout=0.5):
                return  # someone listens there: let `up` say so
            time.sleep(1.0)


def _seed_targets(seeds: list[str], settings: Settings) -> tuple[str, ...]:
    return tuple(sorted({j["target"] for j in jobs_from_lines(seeds, settings,
                                                              PublishReport())}))


class _BrokerBounce(threading.Thread):
    """Hard-kill one broker, keep it down a while, start it again (off the main loop)."""

    def __init__(self, home: Path, node: int, down_s: float, t0: float) -> None:
        super().__init__(name="chaos-broker", daemon=True)
        self.home, self.node, self.down_s, self.t0 = home, node, down_s, t0
        self.record = BrokerKill(node=node, at_s=0.0)
        self.cancel = threading.Event()

    def run(self) -> None:
        try:
            self.record.at_s = round(time.monotonic() - self.t0, 2)
            kafka_local.stop_node(self.node, base_dir=self.home, hard=True)
            self.cancel.wait(self.down_s)
            kafka_local.start_node(self.node, base_dir=self.home)
            self.record.restarted_at_s = round(time.monotonic() - self.t0, 2)
        except Exception as exc:  # report it; the crawl must survive a missing node anyway
            self.record.error = str(exc).splitlines()[0] if str(exc) else repr(exc)


class _Run:
    """One chaos crawl: the fleet, the kill schedule, drain detection and the audit."""

    def __init__(self, settings: Settings, expected: dict[str, int], seeds: list[str],
                 site: DemoSite, kafka_home: Path, plan: Plan, kill_every_s: float, seed: int,
                 timeout_s: float, console: Console, began: float,
                 shape: dict[str, int], *, chaos: bool = True,
                 kill_for_s: float | None = None) -> None:
        self.s = settings
        self.expected = expected
        self.seeds = seeds
        self.site = site
        self.kafka_home = kafka_home
        self.plan = plan
        self.kill_every_s = kill_every_s
        self.rng = random.Random(seed)  # noqa: S311 - a reproducible kill schedule
        self.seed = seed
        self.timeout_s = timeout_s
        self.console = console
        self.began = began
        self.shape = shape
        #: False: the baseline; the schedule runs (same draws, same phase) but kills nobody
        self.chaos = chaos
        self.kill_for_s = kill_for_s
        self.window_s = exposure_window_s(settings.session_timeout_ms)
        self.topo = topology_of(settings)
        self.fleet = Fleet(settings, plan, settings.data_dir / "logs")
        self.kills: list[Kill] = []
        self.bounce: _BrokerBounce | None = None
        self.notes: list[str] = []
        self.unsettled = ""  # why the last drain check failed, for a timeout's report
        self._stage_cycle: list[str] = []
        # (window end, record) of kills whose rebalance may still drop fetch work
        self._windows: list[tuple[float, Kill | BrokerKill]] = []
        self.t0 = time.monotonic()
        self.published_wall = time.time()

    # --- the crawl ----------------------------------------------------------------------

    def execute(self) -> ChaosReport:
        self.s.data_dir.mkdir(parents=True, exist_ok=True)
        create_topics(self.s)
        self.fleet.start()
        try:
            if not wait_ready(self.s, self.fleet, timeout_s=90.0):
                self.notes.append("the groups were not all stable before the seeds went out")
            report = publish(self.seeds, self.s)
            if report.errors:
                raise InfraError(f"seed errors: {report.errors[:3]}")
            self.t0 = time.monotonic()
            self.published_wall = time.time()
            what = "a kill" if self.chaos else "a scheduled kill (not sent)"
            self.console.print(f"crawling {len(self.expected)} pages on {self.shape['hosts']} "
                               f"hosts at {self.s.rate_cap:g} req/s per host (topics "
                               f"{self.s.topic_prefix}*), {what} every "
                               f"{self.kill_every_s:g}s")
            drained, calm_at, last_chaos = self._loop()
            crawl_s = calm_at - self.t0
            drain_s = calm_at - last_chaos if drained else 0.0
            return self._audit(drained, crawl_s, drain_s)
        finally:
            if self.bounce is not None:
                self.bounce.cancel.set()
                self.bounce.join(timeout=120)
            self.fleet.stop()

    def _progress(self) -> float:
        requested = len(self.site.requests) - len(self.s.allowed_targets)  # robots.txt
        return max(0, requested) / max(1, len(self.expected))

    def _loop(self) -> tuple[bool, float, float]:
        probe = LagProbe(self.s)
        killing_until = self.t0 + (self.kill_for_s or max(self.timeout_s * 0.6,
                                                           self.kill_every_s * 4))
        next_kill: float | None = None
        last_chaos = self.t0
        last_print = 0.0
        calm_since: float | None = None
        try:
            while True:
                time.sleep(TICK_S)
                now = time.monotonic()
                self.fleet.heal()
                statuses = read_statuses(self.s.status_dir)
                self._track_exposure(statuses, now)
                progress = self._progress()
                killing = progress < KILL_UNTIL_PROGRESS and now < killing_until
                if next_kill is None and progress > 0:
                    next_kill = now + self._interval()  # the crawl is under way
                if killing and next_kill is not None and now >= next_kill:
                    self._kill(statuses, now)
                    last_chaos = time.monotonic()
                    next_kill = last_chaos + self._interval()
                if self.chaos and self.s.replication == 3 and self.bounce is None and \
                        progress >= BROKER_KILL_AT_PROGRESS:
                    self.bounce = _BrokerBounce(self.kafka_home, BROKER_VICTIM, BROKER_DOWN_S,
                                                self.t0)
                    self.bounce.record.fetch_exposure = _fetch_load(statuses)
                    self._windows.append((now + self.window_s, self.bounce.record))
                    self.console.print(f"[red]{now - self.t0:6.1f}s  SIGKILL broker "
                                       f"{BROKER_VICTIM}[/red] (down {BROKER_DOWN_S:g}s)")
                    self.bounce.start()
                bouncing = self.bounce is not None and self.bounce.is_alive()
                if bouncing and self.bounce is not None:  # exposed until it is back + a while
                    self._windows.append((now + self.window_s, self.bounce.record))
                if self.bounce is not None and not bouncing and \
                        self.bounce.record.restarted_at_s is not None:
                    last_chaos = max(last_chaos, self.t0 + self.bounce.record.restarted_at_s)
                quiet = not killing and not bouncing and \
                    (self.bounce is not None or self.s.replication == 1 or not self.chaos)
                if now - last_print >= 5.0:
                    last_print = now
                    waiting = f"  draining: {self.unsettled[:100]}" \
                        if quiet and self.unsettled else ""
                    self.console.print(f"{now - self.t0:6.1f}s  requested {progress:6.1%}  "
                                       f"kills {len(self.kills)}  restarts "
                                       f"{self.fleet.restarts}{waiting}")
                if quiet and self._calm(statuses, probe):
                    calm_since = calm_since or now
                    if now - calm_since >= 1.0:
                        return True, now, last_chaos
                else:
                    calm_since = None
                if now - self.t0 > self.timeout_s:
                    self.notes.append(f"not drained within {self.timeout_s:g}s; last check: "
                                      f"{self.unsettled or 'chaos still running'}")
                    return False, now, last_chaos
        finally:
            probe.close()

    def _interval(self) -> float:
        return self.kill_every_s * self.rng.uniform(0.75, 1.25)

    def _calm(self, statuses: list[dict[str, Any]], probe: LagProbe) -> bool:
        dead = [w for w, p in self.fleet.procs.items() if p.poll() is not None]
        if dead:
            self.unsettled = f"exited, restarting: {dead}"
            return False
        t = self.topo
        lags = probe.stage_lags(t)
        if _calm(statuses, lags, self.fleet, t.partitions):
            return True
        self.unsettled = _unsettled(statuses, lags, sum(self.plan.counts().values()))
        return False

    # --- kills --------------------------------------------------------------------------

    def _victim(self) -> str:
        """A random worker of the next stage in a shuffled cycle: every stage gets hit."""
        by_stage: dict[str, list[str]] = collections.defaultdict(list)
        for wid in sorted(self.fleet.procs):
            by_stage[wid.rsplit("-", 1)[0]].append(wid)
        if not self._stage_cycle:
            self._stage_cycle = sorted(by_stage)
            self.rng.shuffle(self._stage_cycle)
        return self.rng.choice(by_stage[self._stage_cycle.pop()])

    def _kill(self, statuses: list[dict[str, Any]], now: float) -> None:
        wid = self._victim()
        stage = wid.rsplit("-", 1)[0]
        gauges: dict[str, int] = {}
        for st in statuses:
            if st.get("worker") == wid:
                gauges = st.get("gauges", {})
        proc = self.fleet.procs[wid]
        kill = Kill(at_s=round(now - self.t0, 2), worker=wid, stage=stage, pid=proc.pid,
                    wall=round(time.time(), 3),
                    inflight=int(gauges.get("inflight", 0)),
                    queued=int(gauges.get("queued", 0)))
        self.kills.append(kill)
        if not self.chaos:  # the baseline: the schedule's draws and times, nobody killed
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.fleet.heal()  # the same worker id comes back and fences its former self
        if stage == "fetch":
            kill.fetch_exposure = _fetch_load(statuses)
            self._windows.append((now + self.window_s, kill))
        self.console.print(f"[yellow]{kill.at_s:6.1f}s  SIGKILL {wid}[/yellow] (pid "
                           f"{kill.pid}, in flight {kill.inflight}, queued {kill.queued})")

    def _track_exposure(self, statuses: list[dict[str, Any]], now: float) -> None:
        load = _fetch_load(statuses)
        self._windows = [(end, rec) for end, rec in self._windows if end >= now]
        for _, rec in self._windows:
            rec.fetch_exposure = max(rec.fetch_exposure, load)

    # --- the audit ----------------------------------------------------------------------

    def _audit(self, drained: bool, crawl_s: float, drain_s: float) -> ChaosReport:
        _wait_for_store(self.s)
        q = self._query
        pages_stored = int(q("SELECT count() FROM pages FINAL")[0][0])
        distinct = int(q("SELECT uniqExact(url) FROM pages FINAL")[0][0])
        raw_rows = int(q("SELECT count() FROM pages")[0][0])
        stored = {str(u): int(st) for u, st in q("SELECT url, status FROM pages FINAL")}
        dead = {str(r): int(n) for r, n in
                q("SELECT reason, count() FROM dead_letters FINAL GROUP BY reason "
                  "ORDER BY reason")}
        lost = sorted(set(self.expected) - set(stored))
        unexpected = set(stored) - set(self.expected)
        wrong = sum(1 for u, st in stored.items()
                    if u in self.expected and self.expected[u] != st)
        parsed_records, committed_dupes = committed_duplicates(self.s, self.topo.parsed,
                                                               self.topo.partitions)
        requests, _ = self.site.snapshot()
        page_reqs = {u: n for u, n in requests.items() if not u.endswith("/robots.txt")}
        robots = sum(n for u, n in requests.items() if u.endswith("/robots.txt"))
        total = sum(page_reqs.values())
        distinct_req = len(page_reqs)
        ratio = total / distinct_req if distinct_req else 0.0
        exposure = sum(k.inflight + k.queued + REBALANCES_PER_FETCH_KILL * k.fetch_exposure
                       for k in self.kills if k.stage == "fetch" and self.chaos) + \
            (REBALANCES_PER_FETCH_KILL * self.bounce.record.fetch_exposure
             if self.bounce is not None else 0)
        final_dupes = pages_stored - distinct
        phase = self._phase(drained, drain_s, len(lost))
        return ChaosReport(
            pages=self.shape["pages"], nodes=self.shape["nodes"],
            fetch_workers=self.plan.fetch_workers, parse_workers=self.plan.parse_workers,
            kill_every_s=self.kill_every_s, seed=self.seed, rate_cap=self.s.rate_cap,
            topic_prefix=self.s.topic_prefix,
            pages_expected=len(self.expected), pages_stored=pages_stored,
            distinct_urls=distinct, raw_rows=raw_rows, dead_lettered=sum(dead.values()),
            dead_by_reason=dead, lost=len(lost), lost_sample=lost[:10],
            unexpected_pages=len(unexpected), wrong_status=wrong,
            final_duplicates=final_dupes, committed_duplicates=committed_dupes,
            parsed_records=parsed_records, stored_duplicates=final_dupes + committed_dupes,
            page_requests=total, distinct_requested=distinct_req, robots_requests=robots,
            over_apply_ratio=round(ratio, 4),
            inflight_at_kills=sum(k.inflight + k.queued for k in self.kills),
            fetch_exposure=exposure,
            over_apply_bound=round(1 + exposure / distinct_req, 4) if distinct_req else 1.0,
            kills=self.kills,
            broker_kills=[self.bounce.record] if self.bounce is not None else [],
            restarts=self.fleet.restarts, seconds=round(time.monotonic() - self.began, 1),
            crawl_seconds=round(crawl_s, 1), drain_seconds=round(drain_s, 1),
            drained=drained, notes=self.notes, hosts=self.shape["hosts"],
            session_timeout_s=self.s.session_timeout_ms / 1000.0,
            exposure_window_s=self.window_s, kill_phase=phase)

    def _phase(self, drained: bool, drain_s: float, lost: int) -> Phase | None:
        """This run's stored pages/s from its first kill to its last (module docstring)."""
        window = kill_window([k.wall for k in self.kills])
        if window is None:
            if self.chaos:
                self.notes.append("under two kills: no kill phase to measure the pace over")
            return None
        first_stored = [ms / 1000.0 for (ms,) in self._query(
            "SELECT toUnixTimestamp64Milli(min(stored_at)) FROM pages GROUP BY url")]
        n, rate = pages_in_window(first_stored, *window)
        last = max(first_stored, default=self.published_wall)
        span = last - self.published_wall
        return Phase(kills=len(self.kills), start_s=round(window[0] - self.published_wall, 2),
                     end_s=round(window[1] - self.published_wall, 2), pages=n,
                     pages_per_s=round(rate, 2),
                     crawl_pages_per_s=round(len(first_stored) / span, 2) if span > 0 else 0.0,
                     drain_s=round(drain_s, 1), drained=drained, lost=lost)

    def _query(self, sql: str) -> list[list[Any]]:
        return run_query(self.s, sql)[1]


def _unsettled(statuses: list[dict[str, Any]], lags: dict[str, int], workers: int) -> str:
    """What keeps the pipeline from counting as drained (the inverse of ``_calm``)."""
    out = [f"{k} lag {v}" for k, v in lags.items() if v != 0]
    if len(statuses) < workers:
        out.append(f"{len(statuses)} of {workers} status files")
    for st in statuses:
        g = st.get("gauges", {})
        busy = holds_work(g)
        if busy or st.get("idle_s", 0) < IDLE_S:
            out.append(f"{st.get('worker')} idle {st.get('idle_s')}s {busy}")
    return "; ".join(out) or "calm, but not for long enough"


def _fetch_load(statuses: list[dict[str, Any]]) -> int:
    """In-flight + queued jobs over every fetch worker, from their status files."""
    total = 0
    for st in statuses:
        if st.get("stage") == "fetch":
            g = st.get("gauges", {})
            total += int(g.get("inflight", 0)) + int(g.get("queued", 0))
    return total


def _wait_for_store(settings: Settings, timeout_s: float = 60.0) -> None:
    """Wait until the store process serves queries, so reads never open chDB here."""
    port_file = settings.clickhouse_path / PORT_FILE
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            port = int(port_file.read_text())
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        time.sleep(0.5)
    raise InfraError(f"the store process did not serve queries within {timeout_s:g}s")


def committed_duplicates(settings: Settings, topic: str, partitions: int,
                         timeout_s: float = 120.0) -> tuple[int, int]:
    """(records, duplicates) committed in ``topic``: each key seen more than once counts.

    Read ``read_committed`` from the beginning to the last stable offset, exactly what a
    downstream consumer sees; aborted records (a killed worker's open transaction) are not.
    """
    consumer = Consumer({**settings.kafka_common(), "group.id": f"{settings.topic_prefix}audit",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    counts: collections.Counter[bytes] = collections.Counter()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        pending = set(range(partitions))
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise InfraError(f"could not read {topic} to its end within {timeout_s:g}s")
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                key = msg.key()
                counts[key.encode() if isinstance(key, str) else (key or b"")] += 1
    finally:
        consumer.close()
    return sum(counts.values()), sum(n - 1 for n in counts.values() if n > 1)


# --- output -----------------------------------------------------------------------------


def print_report(report: ChaosReport, console: Console) -> None:
    t = Table(title=f"chaos: {report.pages} pages on {report.hosts} hosts, {report.nodes} "
                    f"Kafka node(s), {report.fetch_workers} fetch + {report.parse_workers} "
                    f"parse workers", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    by_stage = ", ".join(f"{s} {n}" for s, n in sorted(report.kills_by_stage.items()))
    rows: list[tuple[str, str]] = [
        ("pages expected", str(report.pages_expected)),
        ("rate cap per host (req/s)", f"{report.rate_cap:g}"),
        ("session timeout (s)", f"{report.session_timeout_s:g}"),
        ("pages stored (FINAL)", str(report.pages_stored)),
        ("distinct URLs stored", str(report.distinct_urls)),
        ("raw rows (before FINAL)", str(report.raw_rows)),
        ("lost", _mark(report.lost == 0, str(report.lost))),
        ("stored duplicates", _mark(report.stored_duplicates == 0,
                                    str(report.stored_duplicates))),
        ("  FINAL - distinct", str(report.final_duplicates)),
        ("  committed repeats in crawl.parsed",
         f"{report.committed_duplicates} of {report.parsed_records} records"),
        ("unexpected pages stored", str(report.unexpected_pages)),
        ("stored with a wrong status", str(report.wrong_status)),
        ("dead letters", str(report.dead_lettered)),
        *((f"  dead: {r}", str(n)) for r, n in report.dead_by_reason.items()),
        ("page requests / distinct pages",
         f"{report.page_requests} / {report.distinct_requested}"),
        ("fetch over-apply ratio", _mark(report.within_bound,
                                         f"{report.over_apply_ratio:.4f}")),
        ("  bound: 1 + fetch exposure / pages", f"{report.over_apply_bound:.4f}"),
        (f"  exposure: victims + {REBALANCES_PER_FETCH_KILL} x fleet load within "
         f"{report.exposure_window_s:g}s", str(report.fetch_exposure)),
        ("  victims' in-flight + queued at kills", str(report.inflight_at_kills)),
        ("robots.txt requests", str(report.robots_requests)),
        ("worker kills (SIGKILL)", f"{len(report.kills)} ({by_stage})"),
        ("worker restarts", str(report.restarts)),
    ]
    for b in report.broker_kills:
        back = f"restarted at {b.restarted_at_s:.1f}s" if b.restarted_at_s is not None \
            else f"not restarted: {b.error}"
        rows.append((f"broker {b.node} SIGKILL at {b.at_s:.1f}s", back))
    rows += [
        ("crawl seconds (seeds → drained)", f"{report.crawl_seconds:.1f}"),
        ("drain seconds (last chaos → drained)", f"{report.drain_seconds:.1f}"),
        ("seconds (wall, incl. infra)", f"{report.seconds:.1f}"),
        ("drained", _mark(report.drained, "yes" if report.drained else "no")),
        ("ok", _mark(report.ok, "yes" if report.ok else "NO")),
    ]
    for what, value in rows:
        t.add_row(what, value)
    console.print(t)
    console.print(pace_table(report))
    console.print(pace_verdict(report))
    if report.lost_sample:
        console.print("lost, e.g.: " + ", ".join(report.lost_sample))
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if not report.kills:
        return
    kt = Table(title="kills", show_header=True)
    for col in ("at s", "worker", "pid", "in flight", "queued", "fetch in flight+queued"):
        kt.add_column(col, justify="right")
    for k in report.kills:
        kt.add_row(f"{k.at_s:.1f}", k.worker, str(k.pid), str(k.inflight), str(k.queued),
                   str(k.fetch_exposure) if k.stage == "fetch" else "-")
    console.print(kt)



def pace_table(report: ChaosReport) -> Table:
    """Kill phase against the no-kill baseline: pages stored per second, retention, drain."""
    t = Table(title="pace: pages first stored per second over the kill phase (first kill → "
                    "last kill, s from publish); whole = publish → last stored; drain = last "
                    "kill → drained")
    for col in ("run", "phase s", "kills", "pages", "pages/s", "whole /s", "drain s", "lost"):
        t.add_column(col, justify="right")
    for name, ph in (("kills", report.kill_phase), ("no kills", report.baseline)):
        if ph is None:
            t.add_row(name, "-", "-", "-", "-", "-", "-", "-")
            continue
        t.add_row(name, f"{ph.start_s:.1f} → {ph.end_s:.1f}", str(ph.kills), str(ph.pages),
                  f"{ph.pages_per_s:.2f}", f"{ph.crawl_pages_per_s:.2f}",
                  f"{ph.drain_s:.1f}" if ph.drained else "not drained", str(ph.lost))
    return t


def pace_verdict(report: ChaosReport) -> str:
    r = report.retention
    ratio = _mark(report.retains_pace, f"{r:.2f}") if r is not None else "n/a (no baseline)"
    verdict = _mark(report.meets_target, "met" if report.meets_target else "MISSED")
    return (f"throughput retained (kill-phase pages/s ÷ no-kill pages/s): {ratio}, target >= "
            f"{RETENTION_TARGET:g}; issue-11 target (lost 0, duplicates 0, over-apply within "
            f"its bound, retention): {verdict}")


def _mark(good: bool, text: str) -> str:
    return f"[green]{text}[/green]" if good else f"[red]{text}[/red]"


def report_dict(report: ChaosReport) -> dict[str, Any]:
    data = asdict(report)
    data.update(ok=report.ok, within_bound=report.within_bound,
                kills_by_stage=report.kills_by_stage, retention=report.retention,
                retention_target=RETENTION_TARGET, retains_pace=report.retains_pace,
                meets_target=report.meets_target)
    return data


def write_json(report: ChaosReport, path: Path) -> None:
    path.write_text(json.dumps(report_dict(report), indent=2) + "\n")
