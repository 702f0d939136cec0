"""The chaos proof: crawl a local site while SIGKILLing random workers (and a broker).

``run_chaos`` starts its own Kafka (1 node, or 3 with one hard-killed and restarted
mid-crawl), serves the generated bench site on loopback and runs one chaos round
(:mod:`chaos.round`): every stage as its own process, a worker killed every
``kill_every_s`` seconds (seeded schedule) and restarted under its own id. When the crawl is
nearly done it stops killing, waits until the pipeline is drained (by the broker too: no
live parked or timer entry), and audits the result with the independent checker
(:mod:`chaos.loss_check`):

* ``lost``: reachable URLs (from the site generator) neither stored nor dead-lettered;
* duplicates: rows beyond one per URL in FINAL, plus committed repeats in the raw
  ``crawl.parsed`` topic read ``read_committed`` (a dedupe key that appears twice there is a
  result downstream would have seen twice);
* over-apply: page requests beyond need, from the site's own log, against the bound the
  faults justify (:mod:`chaos.exposure`).

It also measures what the churn costs in pace (issue 11, "measured, not assumed"). Unless
``baseline=False``, the same fleet crawls a fresh instance of the same site shape a second
time on its own topic prefix, with the kill schedule running but no signal sent, and the
report compares the two over their *kill phase* (first kill → last kill): pages first
stored per second (from the rows' ``stored_at``), retention = kill-phase pages/s ÷ baseline
pages/s against :data:`RETENTION_TARGET`, and the drain time from the last kill. The kill
run goes first, on a fresh broker: whatever a cold JVM costs falls on it, so the order can
only understate retention, never flatter it.

``crawlfleet chaos --soak MINUTES`` loops rounds of many fault kinds: :mod:`chaos.soak`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console

from chaos.cluster import BASE_PORT, chaos_cluster
from chaos.fault_plan import BROKER_KILL, PlannedFault
from chaos.report import ChaosReport
from chaos.round import ChaosRound, RoundSpec, baseline_of, round_settings
from core.errors import InfraError
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite, free_port

SITE_HOSTS = 8
#: With 3 nodes, one broker goes down once this share of the pages has been requested.
BROKER_KILL_AT_PROGRESS = 0.2
CHAOS_CRAWL_S = 60.0
MIN_RATE_CAP, MAX_RATE_CAP = 2.0, 500.0


def paced_rate_cap(pages: int, kill_every_s: float, hosts: int = SITE_HOSTS) -> float:
    """Per-host cap under which ``pages`` take about max(CHAOS_CRAWL_S, 12 kills)."""
    seconds = max(CHAOS_CRAWL_S, 12 * kill_every_s)
    return min(MAX_RATE_CAP, max(MIN_RATE_CAP, pages / (hosts * seconds)))


def site_hosts(hosts: int) -> tuple[str, ...]:
    return tuple(f"127.0.0.{2 + k}" for k in range(hosts))


def crawl_round(spec: RoundSpec, bootstrap: str, root: Path, kafka_home: Path,
                console: Console, prefix_stem: str = "chaos") -> ChaosReport:
    """One round on a fresh site and fresh topics under ``root/runs/<prefix>``."""
    prefix = f"{prefix_stem}{int(time.time())}{uuid.uuid4().hex[:6]}."
    site_spec = bench_spec(free_port(site_hosts(spec.hosts), 18900), pages=spec.pages,
                           hosts=spec.hosts)
    settings = round_settings(bootstrap, root / "runs" / prefix.rstrip("."), prefix, spec,
                              site_spec.seeds())
    with DemoSite(site_spec) as site:
        return ChaosRound(spec, settings, site_spec, site, kafka_home, console).execute()


def run_chaos(pages: int, nodes: int, fetch_workers: int, parse_workers: int,
              kill_every_s: float, seed: int, data_dir: Path | None, timeout_s: float,
              console: Console, *, rate_cap: float | None = None, hosts: int = SITE_HOSTS,
              partitions: int = 12, baseline: bool = True,
              kill_for_s: float | None = None,
              heavy: tuple[PlannedFault, ...] | None = None,
              worker_kills: bool = True) -> ChaosReport:
    """Crawl ``pages`` local pages on ``hosts`` hosts under worker kills (and a broker kill
    with 3 nodes), then (``baseline``) the same shape again with nobody killed.

    ``rate_cap`` (requests/s per host) defaults to a pace that makes the crawl last about
    :data:`CHAOS_CRAWL_S` (or a dozen kill intervals): unpaced, a CPU-bound crawl of a few
    thousand local pages is over after a handful of kills. Kills stop once 90% of the pages
    were requested, or after ``kill_for_s``. Sessions keep the settings' default timeout, as
    a deployment's do. A round that fails keeps its folder (the evidence) even when
    ``data_dir`` is None. ``heavy`` replaces the 3-node broker kill with other faults (e.g.
    a rolling restart), ``worker_kills`` False sends no random worker kills.
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
    spec = RoundSpec(
        pages=pages, hosts=hosts, nodes=nodes, fetch_workers=fetch_workers,
        parse_workers=parse_workers, kill_every_s=kill_every_s, seed=seed,
        timeout_s=timeout_s, rate_cap=rate_cap or paced_rate_cap(pages, kill_every_s, hosts),
        partitions=partitions, kill_for_s=kill_for_s,
        heavy=heavy if heavy is not None else
        (PlannedFault(BROKER_KILL, BROKER_KILL_AT_PROGRESS),) if nodes == 3 else (),
        worker_kills=worker_kills)
    keep = False
    try:
        console.print(f"[bold]chaos[/bold]: starting a {nodes}-node Kafka in {kafka_home}")
        with chaos_cluster(kafka_home, nodes, BASE_PORT[nodes]) as bootstrap:
            report = crawl_round(spec, bootstrap, root, kafka_home, console)
            keep = bool(report.evidence)
            if baseline:
                console.print("[bold]baseline[/bold]: the same fleet on a fresh site of the "
                              "same shape, the same kill schedule, no kills")
                base = crawl_round(baseline_of(spec), bootstrap, root, kafka_home, console)
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
        if temp and not keep:
            shutil.rmtree(root, ignore_errors=True)
