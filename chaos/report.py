"""What a chaos round found: the records of its faults, its verdict, its pace, as text.

The verdict is the independent checker's (:mod:`chaos.loss_check`: the site's log,
the store's rows, the generator's reachable set), plus committed repeats in the raw
``crawl.parsed`` topic and the broker's live parked/timer entries at the end. The pace
figures (issue 11) compare the kill phase (first kill → last kill) with the same fleet's
no-kill baseline: pages first stored per second inside the phase, from the rows' own
``stored_at``.
"""

from __future__ import annotations

import collections
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chaos.drain import BrokerState
from chaos.exposure import Bound
from chaos.fault_plan import WORKER_KILL
from chaos.loss_check import LossVerdict, verdict_lines

#: Kill-phase pages/s ÷ the no-kill rate the fleet must keep (issue 11).
RETENTION_TARGET = 0.8


@dataclass
class Kill:
    """One SIGKILL of a worker, with what it held just before (its status file)."""

    at_s: float
    worker: str
    stage: str
    pid: int
    wall: float  # time.time() of the kill, to line up with logs and record timestamps
    inflight: int
    queued: int
    uncommitted: int | None  # None: the worker's status has no such gauge
    cause: str = WORKER_KILL  # or the heavy fault the kill is part of


@dataclass
class FaultRecord:
    """One fault other than a plain worker kill: what, on whom, when, and how it ended."""

    kind: str
    target: str  # "broker 2", "all brokers", "store-0", "fetch-1"
    at_s: float
    wall: float
    ended_at_s: float | None = None  # restarted, thawed, readers stopped
    error: str = ""
    detail: str = ""


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
    hosts: int
    fetch_workers: int
    parse_workers: int
    kill_every_s: float
    seed: int
    rate_cap: float  # requests/s per host
    topic_prefix: str
    session_timeout_s: float
    verdict: LossVerdict
    committed_duplicates: int  # extra committed records per dedupe key in crawl.parsed
    parsed_records: int  # committed records read from crawl.parsed
    robots_requests: int
    bound: Bound
    kills: list[Kill]
    faults: list[FaultRecord]
    restarts: int
    broker: BrokerState  # live parked/timer entries when the round was audited
    seconds: float  # wall time: the round's start to its audit
    crawl_seconds: float  # seeds published to drained
    drain_seconds: float  # last fault to drained
    drained: bool
    notes: list[str] = field(default_factory=list)
    kill_phase: Phase | None = None  # this run's pace over first kill → last kill
    baseline: Phase | None = None  # the same fleet, site shape and schedule, nobody killed
    evidence: str = ""  # the folder holding a failed round's report, lineage and logs
    #: repeated page requests, by the latest fault before each (which fault made work redone)
    repeats_by_fault: dict[str, int] = field(default_factory=dict)
    #: the busiest host's most requests in any 1-s window (the site's own log), and the host
    peak_host_requests: int = 0
    peak_host: str = ""
    #: that host's requests in its busiest 1-s window: (seconds since the round's start, path)
    peak_window: list[tuple[float, str]] = field(default_factory=list)
    #: topics of stages declared with ``register_stage``: (committed records, repeated keys)
    declared_outputs: dict[str, tuple[int, int]] = field(default_factory=dict)

    # --- the verdict ----------------------------------------------------------------------

    @property
    def lost(self) -> int:
        return self.verdict.lost_count

    @property
    def stored_duplicates(self) -> int:
        """Rows a reader sees twice (FINAL) plus records downstream would see twice."""
        return self.verdict.duplicates + self.committed_duplicates

    @property
    def over_apply(self) -> int:
        """Page requests beyond what each URL needs, from the site's own log."""
        return self.verdict.request_over_apply

    @property
    def within_bound(self) -> bool:
        return self.over_apply <= self.bound.used

    @property
    def store_within_bound(self) -> bool | None:
        """Raw rows beyond one per key within the store victims' uncommitted (None: not
        judged, the store did not report the gauge)."""
        if self.bound.store_gauge_missing:
            return None
        return self.verdict.store_over_apply <= self.bound.store_rows

    @property
    def ok(self) -> bool:
        """Drained (by the broker too), nothing lost, nothing duplicated, nothing invented."""
        return self.drained and self.verdict.ok and self.committed_duplicates == 0 \
            and self.broker.empty and not any(r for _, r in self.declared_outputs.values())

    @property
    def kills_by_stage(self) -> dict[str, int]:
        return dict(collections.Counter(k.stage for k in self.kills))

    @property
    def faults_by_kind(self) -> dict[str, int]:
        """Faults injected, by kind: plain worker kills and each heavy fault."""
        out = collections.Counter(f.kind for f in self.faults if not f.error)
        plain = sum(1 for k in self.kills if k.cause == WORKER_KILL)
        if plain:
            out[WORKER_KILL] = plain
        return dict(sorted(out.items()))

    @property
    def failures(self) -> list[str]:
        """Why the round failed, one phrase each (empty: it passed)."""
        out = []
        if not self.drained:
            out.append("not drained")
        if self.lost:
            out.append(f"lost {self.lost}")
        if self.stored_duplicates:
            out.append(f"duplicates {self.stored_duplicates}")
        if self.verdict.unreachable_stored:
            out.append(f"unreachable stored {len(self.verdict.unreachable_stored)}")
        if self.verdict.stored_unrequested:
            out.append(f"stored unrequested {len(self.verdict.stored_unrequested)}")
        if self.drained and not self.broker.empty:
            out.append(self.broker.describe())
        if not self.within_bound:
            out.append(f"over-apply {self.over_apply} above its bound {self.bound.used}")
        if self.store_within_bound is False:
            out.append(f"store over-apply {self.verdict.store_over_apply} above its bound "
                       f"{self.bound.store_rows}")
        return out

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


# --- output -----------------------------------------------------------------------------


def print_report(report: ChaosReport, console: Console) -> None:
    v = report.verdict
    t = Table(title=f"chaos: {report.pages} pages on {report.hosts} hosts, {report.nodes} "
                    f"Kafka node(s), {report.fetch_workers} fetch + {report.parse_workers} "
                    f"parse workers", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    by_stage = ", ".join(f"{s} {n}" for s, n in sorted(report.kills_by_stage.items()))
    b = report.bound
    rows: list[tuple[str, str]] = [
        ("reachable URLs (site generator)", str(v.reachable)),
        ("rate cap per host (req/s)", f"{report.rate_cap:g}"),
        ("busiest host, most requests in 1 s", f"{report.peak_host_requests} "
                                               f"({report.peak_host or '-'})"),
        ("session timeout (s)", f"{report.session_timeout_s:g}"),
        ("stored exactly once (FINAL)", str(v.stored_once)),
        ("lost", _mark(report.lost == 0, str(report.lost))),
        ("stored duplicates", _mark(report.stored_duplicates == 0,
                                    str(report.stored_duplicates))),
        ("  rows beyond one per URL in FINAL", str(v.duplicates)),
        ("  committed repeats in crawl.parsed",
         f"{report.committed_duplicates} of {report.parsed_records} records"),
        *((f"  committed repeats in {t} (declared)", _mark(r == 0, f"{r} of {n} records"))
          for t, (n, r) in report.declared_outputs.items()),
        ("stored but unreachable / never requested",
         _mark(not v.unreachable_stored and not v.stored_unrequested,
               f"{len(v.unreachable_stored)} / {len(v.stored_unrequested)}")),
        ("stored with a wrong status", str(len(v.wrong_status))),
        ("dead-lettered (reachable)", str(sum(v.dead_lettered.values()))),
        *((f"  dead: {r}", str(n)) for r, n in v.dead_lettered.items()),
        *((f"  dead, unreachable: {r}", str(n)) for r, n in v.unreachable_dead.items()),
        ("page requests / distinct URLs (site log)",
         f"{v.page_requests} / {v.requested_urls}"),
        ("request over-apply (beyond need)",
         _mark(report.within_bound, str(report.over_apply))),
        (f"  bound ({b.basis})", str(b.used)),
        ("  from uncommitted + in flight at drops / legacy estimate",
         f"{b.requests} / {b.legacy}"),
        ("  drops", ", ".join(f"{c} {n}" for c, n in sorted(b.drops_by_cause.items()))
         or "0"),
        ("store over-apply (raw rows beyond one per key)",
         f"{v.store_over_apply} (bound "
         f"{'n/a' if report.store_within_bound is None else b.store_rows})"),
        ("broker at the end", _mark(report.broker.empty, report.broker.describe())),
        ("robots.txt requests", str(report.robots_requests)),
        ("worker kills (SIGKILL)", f"{len(report.kills)} ({by_stage})"),
        ("faults by kind", ", ".join(f"{k} {n}" for k, n in report.faults_by_kind.items())),
        ("worker restarts", str(report.restarts)),
    ]
    for f in report.faults:
        end = f" → {f.ended_at_s:.1f}s" if f.ended_at_s is not None else ""
        what = f"error: {f.error}" if f.error else f.detail
        rows.append((f"{f.kind} {f.target} at {f.at_s:.1f}s{end}", what[:90]))
    rows += [
        ("crawl seconds (seeds → drained)", f"{report.crawl_seconds:.1f}"),
        ("drain seconds (last fault → drained)", f"{report.drain_seconds:.1f}"),
        ("seconds (wall)", f"{report.seconds:.1f}"),
        ("drained", _mark(report.drained, "yes" if report.drained else "no")),
        ("ok", _mark(report.ok, "yes" if report.ok else "NO: " + "; ".join(report.failures))),
    ]
    for what, value in rows:
        t.add_row(what, value)
    console.print(t)
    if report.kill_phase is not None or report.baseline is not None:
        console.print(pace_table(report))
        console.print(pace_verdict(report))
    if report.repeats_by_fault:
        top = sorted(report.repeats_by_fault.items(), key=lambda kv: -kv[1])[:8]
        console.print("repeated requests after each fault (the latest before each repeat): "
                      + ", ".join(f"{label}: {n}" for label, n in top))
    if v.lost:
        console.print("lost, e.g.: " + ", ".join(v.lost[:10]))
    if b.gauge_missing:
        console.print("[yellow]note:[/yellow] a fetch victim's status had no `uncommitted` "
                      "gauge: counted as 0, so the bound is the legacy exposure estimate")
    if b.store_gauge_missing:
        console.print("[yellow]note:[/yellow] a store victim's status had no `uncommitted` "
                      "gauge: counted as 0, so the store's over-apply is not judged")
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if report.evidence:
        console.print(f"[bold]evidence[/bold] (report, lineage of lost URLs, worker and "
                      f"broker logs): {report.evidence}")
    if not report.kills:
        return
    kt = Table(title="kills", show_header=True)
    for col in ("at s", "worker", "cause", "pid", "in flight", "queued", "uncommitted"):
        kt.add_column(col, justify="right")
    for k in report.kills:
        kt.add_row(f"{k.at_s:.1f}", k.worker, k.cause, str(k.pid), str(k.inflight),
                   str(k.queued), "-" if k.uncommitted is None else str(k.uncommitted))
    console.print(kt)


def report_text(report: ChaosReport) -> str:
    """The report as plain text (a file in the round's evidence)."""
    console = Console(width=120, force_terminal=False, record=True, file=io.StringIO())
    print_report(report, console)
    return console.export_text() + "\n" + "\n".join(verdict_lines(report.verdict)) + "\n"


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
    data.update(ok=report.ok, lost=report.lost, stored_duplicates=report.stored_duplicates,
                over_apply=report.over_apply, over_apply_bound=report.bound.used,
                within_bound=report.within_bound, store_within_bound=report.store_within_bound,
                failures=report.failures, kills_by_stage=report.kills_by_stage,
                faults_by_kind=report.faults_by_kind, retention=report.retention,
                retention_target=RETENTION_TARGET, retains_pace=report.retains_pace,
                meets_target=report.meets_target)
    return data


def write_json(report: ChaosReport, path: Path) -> None:
    path.write_text(json.dumps(report_dict(report), indent=2, default=str) + "\n")
