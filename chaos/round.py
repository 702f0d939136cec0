"""One chaos round: a fleet crawling a local site while faults hit it, then the audit.

The round starts every stage as its own process (:class:`crawlfleet.crawl.Fleet`, which
restarts a dead one under its own worker id), waits until every group is stable, publishes
the seeds, and then, while the crawl runs:

* every ``kill_every_s`` (x 0.75..1.25) kills a worker with SIGKILL, the stages in a
  shuffled cycle (:class:`chaos.fault_plan.StageCycle`), until
  :data:`KILL_UNTIL_PROGRESS` of the pages were requested (or ``kill_for_s``);
* fires its heavy faults (:mod:`chaos.faults`) one at a time, each once its share
  of the pages has been requested;
* samples every worker's status for the over-apply bound (:mod:`chaos.exposure`).

Then it waits until the pipeline is drained, by the broker too (:mod:`chaos.drain`),
and audits the store with the independent checker (:mod:`chaos.loss_check`; the pace
and the site log's timings: :mod:`chaos.audit`). A round that fails keeps its
evidence in its folder (:mod:`chaos.evidence`).

``chaos=False`` is the no-kill baseline: the same schedule is drawn at the same moments
and nobody is killed, so its kill phase is the same span of the same crawl.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from chaos.audit import (
    kill_phase,
    peak_host_rate,
    peak_window,
    requests_between,
    timed_page_requests,
    wait_for_store,
)
from chaos.broker_trace import committed_repeats
from chaos.drain import DrainCheck, broker_state
from chaos.evidence import keep_evidence, stuck_notes
from chaos.exposure import Exposure, repeats_by_fault
from chaos.fault_plan import (
    BROKER_FREEZE,
    BROKER_KILL,
    RESTART_ALL,
    ROLLING_RESTART,
    STATE_WIPE,
    STORE_RESTART,
    WORKER_KILL,
    PlannedFault,
    StageCycle,
    stateful_stages,
)
from chaos.faults import (
    FREEZE_MARGIN_S,
    BrokerFreeze,
    BrokerKill,
    FaultThread,
    RestartAll,
    RollingRestart,
    StoreRestart,
    wipe_state,
)
from chaos.loss_check import check_run
from chaos.report import ChaosReport, FaultRecord, Kill
from core.config import Settings
from core.errors import CrawlfleetError, InfraError
from crawlfleet.crawl import wait_ready
from crawlfleet.fleet import Fleet, Plan
from infra.topics import create_topics, topology_of
from producers.frontier import PublishReport, jobs_from_lines, publish
from schemas.stages import declared_modules, user_topics
from sites.demo_server import DemoSite
from sites.site_spec import SiteSpec
from streams.status import read_statuses

#: Stop killing once this share of the expected pages has been requested: the tail of the
#: crawl then drains without chaos, so "drained" measures recovery, not luck.
KILL_UNTIL_PROGRESS = 0.9
#: A restarted worker's process start-up plus its join, on a loaded two-core machine.
RESTART_ALLOWANCE_S = 10.0
TICK_S = 0.5
#: Faults that can make every fetch worker drop its work (for the legacy estimate).
FLEET_FAULTS = frozenset({BROKER_KILL, BROKER_FREEZE, RESTART_ALL, ROLLING_RESTART})


class RoundError(InfraError):
    """A round that could not finish its audit; ``folder`` keeps what it left."""

    def __init__(self, message: str, folder: Path) -> None:
        super().__init__(message)
        self.folder = folder


def exposure_window_s(session_timeout_ms: int) -> float:
    """How long after a fetch kill or broker fault a rebalance can still drop fetch work:
    the session timeout (a dead member's expiry) plus a replacement's start-up and join."""
    return session_timeout_ms / 1000.0 + RESTART_ALLOWANCE_S


@dataclass(frozen=True)
class RoundSpec:
    """The shape of one round and its fault schedule."""

    pages: int
    hosts: int
    nodes: int
    fetch_workers: int
    parse_workers: int
    kill_every_s: float
    seed: int
    timeout_s: float
    rate_cap: float
    partitions: int = 12
    heavy: tuple[PlannedFault, ...] = ()
    worker_kills: bool = True
    kill_for_s: float | None = None
    chaos: bool = True  # False: the baseline, the schedule drawn and nothing sent


def round_settings(bootstrap: str, data_dir: Path, prefix: str, spec: RoundSpec,
                   seeds: list[str]) -> Settings:
    """A round's settings: the defaults a user gets, apart from what a local run needs."""
    settings = Settings(
        bootstrap_servers=bootstrap, data_dir=data_dir, topic_prefix=prefix,
        partitions=spec.partitions, replication=3 if spec.nodes == 3 else 1,
        allow_private=True, scope="seeds", rate_cap=spec.rate_cap,
        stage_modules=declared_modules())  # stages declared in this process run too
    targets = tuple(sorted({j["target"] for j in jobs_from_lines(seeds, settings,
                                                                 PublishReport())}))
    return settings.replace(allowed_targets=targets)


class ChaosRound:
    """Runs one round: the crawl loop, the faults, the drain, the audit."""

    def __init__(self, spec: RoundSpec, settings: Settings, site_spec: SiteSpec,
                 site: DemoSite, kafka_home: Path, console: Console) -> None:
        self.spec = spec
        self.s = settings
        self.site_spec = site_spec
        self.site = site
        self.kafka_home = kafka_home
        self.console = console
        self.expected = site_spec.expected()
        self.topo = topology_of(settings)
        # No quarantine app: chaos audits the pipeline's no-loss, which it takes no part in.
        self.plan = Plan(fetch_workers=spec.fetch_workers, parse_workers=spec.parse_workers,
                         quarantine_workers=0)
        self.fleet = Fleet(settings, self.plan, settings.data_dir / "logs")
        self.rng = random.Random(spec.seed)  # noqa: S311 - a reproducible schedule
        self.kill_cycle = StageCycle(self.rng)
        self.wipe_cycle = StageCycle(random.Random(spec.seed + 1))  # noqa: S311
        self.exposure = Exposure(exposure_window_s(settings.session_timeout_ms))
        self.kills: list[Kill] = []
        self.faults: list[FaultRecord] = []
        self.notes: list[str] = []
        self.active: FaultThread | None = None
        self._active_window = ""
        self._lock = threading.Lock()  # fleet.procs: the loop heals, fault threads kill
        self.began = time.monotonic()
        self.t0 = self.began
        self.published_wall = time.time()
        self._mono_offset = time.time() - time.monotonic()

    # --- the crawl ----------------------------------------------------------------------

    def execute(self) -> ChaosReport:
        self.s.data_dir.mkdir(parents=True, exist_ok=True)
        create_topics(self.s)
        self.fleet.start()
        drain = DrainCheck(self.s, self.topo, self.fleet)
        try:
            if not wait_ready(self.s, self.fleet, timeout_s=90.0):
                self.notes.append("the groups were not all stable before the seeds went out")
            report = publish(self.site_spec.seeds(), self.s)
            if report.errors:
                raise InfraError(f"seed errors: {report.errors[:3]}")
            self.t0 = time.monotonic()
            self.published_wall = time.time()
            what = "a kill" if self.spec.chaos else "a scheduled kill (not sent)"
            heavy = ", ".join(f"{f.kind} at {f.at_progress:.0%}" for f in self.spec.heavy)
            self.console.print(
                f"crawling {len(self.expected)} pages on {self.spec.hosts} hosts at "
                f"{self.s.rate_cap:g} req/s per host (topics {self.s.topic_prefix}*), "
                f"{what} every {self.spec.kill_every_s:g}s"
                + (f"; faults: {heavy}" if heavy and self.spec.chaos else ""))
            drained, calm_at, last_chaos = self._loop(drain)
            crawl_s = calm_at - self.t0
            drain_s = calm_at - last_chaos if drained else 0.0
            if not drained and drain.why:
                self.notes.append(f"not drained within {self.spec.timeout_s:g}s; last check: "
                                  f"{drain.why}")
                # What the stuck workers said last: in CI the round's folder is gone once
                # the job ends, and the report is all that is left to read.
                self.notes += stuck_notes(drain.stuck, drain.silent, self.fleet.log_dir,
                                          {w: p.pid for w, p in self.fleet.procs.items()})
            try:
                result = self._audit(drained, crawl_s, drain_s)
            except CrawlfleetError as exc:  # e.g. the store never served again: a stall
                (self.s.data_dir / "error.txt").write_text(
                    f"audit failed: {exc}\nlast drain check: {drain.why}\n")
                raise RoundError(f"round {self.s.topic_prefix} could not be audited: {exc}; "
                                 f"its folder (logs, store, status) is {self.s.data_dir}",
                                 self.s.data_dir) from exc
            if not result.ok or not result.within_bound:
                result.evidence = str(keep_evidence(result, self.s, self.topo,
                                                    self.kafka_home, self.console))
            return result
        finally:
            drain.close()
            if self.active is not None:
                self.active.cancel.set()
                self.active.join(timeout=180)
            self.fleet.stop()

    def _progress(self) -> float:
        requested = len(self.site.requests) - len(self.s.allowed_targets)  # robots.txt
        return max(0, requested) / max(1, len(self.expected))

    def _loop(self, drain: DrainCheck) -> tuple[bool, float, float]:
        spec = self.spec
        killing_until = self.t0 + (spec.kill_for_s or max(spec.timeout_s * 0.6,
                                                           spec.kill_every_s * 4))
        pending = list(spec.heavy) if spec.chaos else []
        next_kill: float | None = None
        last_chaos = self.t0
        last_print = 0.0
        calm_since: float | None = None
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            with self._lock:
                self.fleet.heal()
            statuses = read_statuses(self.s.status_dir)
            self.exposure.observe(statuses, time.time())
            progress = self._progress()
            killing = spec.worker_kills and progress < KILL_UNTIL_PROGRESS \
                and now < killing_until
            if next_kill is None and progress > 0:
                next_kill = now + self._interval()  # the crawl is under way
            if killing and next_kill is not None and now >= next_kill:
                victim = self.kill_cycle.next_victim(list(self.fleet.procs))
                self.kill(victim, WORKER_KILL)
                last_chaos = time.monotonic()
                next_kill = last_chaos + self._interval()
            if self.active is not None:
                if self.active.is_alive():
                    if self._active_window:
                        self.exposure.extend(self._active_window, time.time())
                else:
                    last_chaos = max(last_chaos, time.monotonic())
                    self.active = None
            if self.active is None and pending and progress >= pending[0].at_progress:
                self._start(pending.pop(0).kind)
                last_chaos = max(last_chaos, time.monotonic())
            quiet = not killing and not pending and self.active is None
            if now - last_print >= 5.0:
                last_print = now
                waiting = f"  draining: {drain.why[:110]}" if quiet and drain.why else ""
                self.console.print(f"{now - self.t0:6.1f}s  requested {progress:6.1%}  "
                                   f"kills {len(self.kills)}  faults {len(self.faults)}  "
                                   f"restarts {self.fleet.restarts}{waiting}")
            if quiet and drain.drained(statuses):
                calm_since = calm_since or now
                if now - calm_since >= 1.0:
                    return True, now, last_chaos
            else:
                calm_since = None
            if now - self.t0 > spec.timeout_s:
                if not quiet:
                    drain.why = "chaos still running"
                return False, now, last_chaos

    def _interval(self) -> float:
        return self.spec.kill_every_s * self.rng.uniform(0.75, 1.25)

    # --- faults -------------------------------------------------------------------------

    def stop_worker(self, wid: str, cause: str) -> None:
        """SIGTERM worker ``wid`` and wait for its clean exit (SIGKILL after 60 s); the loop's
        heal restarts it. Recorded as a kill: what it had in flight may be fetched again."""
        self.kill(wid, cause, sig=signal.SIGTERM)

    def _serving(self, wid: str) -> bool:
        """``wid`` runs again (a process of its own id) and says it is not waiting."""
        proc = self.fleet.procs.get(wid)
        if proc is None or proc.poll() is not None:
            return False
        st = next((x for x in read_statuses(self.s.status_dir) if x.get("worker") == wid),
                  None)
        return st is not None and st.get("pid") == proc.pid and not st.get("waiting")

    def kill(self, wid: str, cause: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """SIGKILL worker ``wid`` (sampled just before); the loop's heal restarts it."""
        with self._lock:
            stage = wid.rsplit("-", 1)[0]
            status = next((st for st in read_statuses(self.s.status_dir)
                           if st.get("worker") == wid), None)
            g = status.get("gauges", {}) if status else {}
            proc = self.fleet.procs[wid]
            now = time.monotonic()
            unc = g.get("uncommitted")
            self.kills.append(Kill(
                at_s=round(now - self.t0, 2), worker=wid, stage=stage, pid=proc.pid,
                wall=round(time.time(), 3), inflight=int(g.get("inflight", 0)),
                queued=int(g.get("queued", 0)), uncommitted=None if unc is None else int(unc),
                cause=cause))
            if not self.spec.chaos:  # the baseline: the schedule's draws, nobody killed
                return
            drop = self.exposure.on_kill(status, wid, stage, cause, time.time())
            if proc.poll() is None:
                proc.send_signal(sig)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if sig != signal.SIGKILL:
                # A stopping worker holds its work until it is gone (its final commit may
                # wait on a broker): the site's requests until then count, not until the ask.
                drop.wall = time.time()
        k = self.kills[-1]
        self.console.print(f"[yellow]{k.at_s:6.1f}s  {sig.name} {wid}[/yellow] ({cause}; pid "
                           f"{k.pid}, in flight {k.inflight}, queued {k.queued}, "
                           f"uncommitted {'-' if k.uncommitted is None else k.uncommitted})")

    def _start(self, kind: str) -> None:
        now = time.monotonic()
        rec = FaultRecord(kind=kind, target="", at_s=round(now - self.t0, 2),
                          wall=round(time.time(), 3))
        self.faults.append(rec)
        node = self.rng.randint(1, self.spec.nodes)
        thread: FaultThread | None = None
        if kind == BROKER_KILL:
            rec.target = f"broker {node}"
            thread = BrokerKill(rec, self.t0, self.kafka_home, node)
        elif kind == BROKER_FREEZE:
            rec.target = f"broker {node}"
            thread = BrokerFreeze(rec, self.t0, self.kafka_home, node,
                                  self.s.session_timeout_ms / 1000.0 + FREEZE_MARGIN_S)
        elif kind == RESTART_ALL:
            rec.target = "all brokers"
            thread = RestartAll(rec, self.t0, self.kafka_home)
        elif kind == STORE_RESTART:
            rec.target = "store-0"
            thread = StoreRestart(rec, self.t0, self.s, self.kill, "store-0")
        elif kind == ROLLING_RESTART:
            rec.target = "every broker, then every worker"
            thread = RollingRestart(rec, self.t0, self.kafka_home, self.spec.nodes,
                                    self.stop_worker, lambda: list(self.fleet.procs),
                                    self._serving, lambda: len(self.site.requests))
        elif kind == STATE_WIPE:
            victim = self.wipe_cycle.next_victim(list(self.fleet.procs), stateful_stages())
            rec.target = victim
            wipe_state(self.s, self.kill, victim, victim.rsplit("-", 1)[0], rec)
            rec.ended_at_s = round(time.monotonic() - self.t0, 2)
        else:
            raise InfraError(f"unknown fault kind {kind!r}")
        self.console.print(f"[red]{rec.at_s:6.1f}s  {kind} {rec.target}[/red]"
                           + (f" ({rec.detail})" if rec.detail else "")
                           + (f" [red]failed: {rec.error}[/red]" if rec.error else ""))
        if kind in FLEET_FAULTS:
            self._active_window = self.exposure.open_window(time.time())
        else:
            self._active_window = ""
        if thread is not None:
            self.active = thread
            thread.start()

    # --- the audit ----------------------------------------------------------------------

    def _audit(self, drained: bool, crawl_s: float, drain_s: float) -> ChaosReport:
        wait_for_store(self.s)
        verdict = check_run(self.site_spec, self.site, self.s)
        parsed_records, repeats = committed_repeats(self.s, self.topo.parsed,
                                                    self.topo.partitions)
        # Declared stages' outputs are held to the same rule: one committed record per key.
        declared = {d.name: committed_repeats(self.s, self.topo.prefix + d.name,
                                              self.topo.partitions)
                    for d in user_topics()}
        counts, _ = self.site.snapshot()
        robots = sum(n for u, n in counts.items() if u.endswith("/robots.txt"))
        timed = timed_page_requests(self.site, self.site_spec.port)
        peak = peak_host_rate(self.site)
        offset = self._mono_offset
        busiest = [(round(t - self.t0, 3), raw) for t, raw in peak_window(self.site, peak[0])]

        def between(from_wall: float, to_wall: float) -> int:
            return requests_between(timed, from_wall - offset, to_wall - offset)

        phase = kill_phase(self.s, self.kills, self.published_wall, drained, drain_s,
                           verdict.lost_count)
        if phase is None and self.spec.chaos:
            self.notes.append("under two kills: no kill phase to measure the pace over")
        spec = self.spec
        return ChaosReport(
            pages=spec.pages, nodes=spec.nodes, hosts=spec.hosts,
            fetch_workers=spec.fetch_workers, parse_workers=spec.parse_workers,
            kill_every_s=spec.kill_every_s, seed=spec.seed, rate_cap=self.s.rate_cap,
            topic_prefix=self.s.topic_prefix,
            session_timeout_s=self.s.session_timeout_ms / 1000.0, verdict=verdict,
            committed_duplicates=repeats, parsed_records=parsed_records,
            robots_requests=robots, bound=self.exposure.bound(between),
            kills=self.kills, faults=self.faults, restarts=self.fleet.restarts,
            broker=broker_state(self.s, self.topo),
            seconds=round(time.monotonic() - self.began, 1), crawl_seconds=round(crawl_s, 1),
            drain_seconds=round(drain_s, 1), drained=drained, notes=self.notes,
            kill_phase=phase, repeats_by_fault=repeats_by_fault(timed, self._fault_times()),
            peak_host=peak[0], peak_host_requests=peak[1], declared_outputs=declared,
            peak_window=busiest)

    def _fault_times(self) -> list[tuple[float, str]]:
        """Every fault sent, (monotonic time, label), to put repeated requests down to."""
        if not self.spec.chaos:
            return []
        out = [(self.t0 + k.at_s, f"{k.cause} {k.worker} @{k.at_s:g}s") for k in self.kills]
        out += [(self.t0 + f.at_s, f"{f.kind} {f.target} @{f.at_s:g}s")
                for f in self.faults if f.kind in FLEET_FAULTS]
        return out


def baseline_of(spec: RoundSpec) -> RoundSpec:
    """The same round with nothing sent: the no-kill baseline."""
    return replace(spec, chaos=False)
