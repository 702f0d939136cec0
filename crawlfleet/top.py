"""``crawlfleet top``: a live view of the whole fleet, from any host that reaches Kafka.

Everything it shows comes from the shared systems, never from a worker's local files: queue
depth and throughput from the consumer groups' committed offsets (Kafka), workers from the
groups' members (their client id is the worker id), settings in force from ``crawl.control``
(paused fleet and targets, live caps), and what requests did (success, block rate, dead letters,
versions per worker) from the store over the last few minutes. A source that is unreachable is
shown as such; the rest of the view still works.

Two things come from elsewhere because nothing shared can say them fast enough: a stage
with lag whose group members are all dead or waiting is shown "stalled" at once when their
status files are on this host (a killed static member stays in its group until its session
times out); and the work the broker holds beyond any lag -- live entries of ``crawl.parked``
and ``crawl.timers`` -- is read from the changelogs themselves every ``HELD_EVERY_S``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from core.config import Settings
from core.errors import CrawlfleetError
from core.timefmt import clock_utc
from crawlfleet.health import HeldWork, quarantine_held, read_held_work, stalls
from crawlfleet.progress import kafka_reason
from infra.lag import LagProbe
from infra.store_query import run_query
from infra.topics import topology_of
from schemas.codec import default_codec
from schemas.stages import every_stage
from schemas.stages import stages as topology_stages
from streams.control import ControlReader, Quarantine
from streams.status import read_statuses

SPARKS = "▁▂▃▄▅▆▇█"
HISTORY = 30
#: The store is asked about this recent window.
RECENT_S = 300
#: The parked and timer changelogs (a full read each) are counted this often.
HELD_EVERY_S = 10.0
#: How long a refresh waits for a starting store worker to serve, before it says so.
STORE_WAIT_S = 2.0


def sparkline(values: list[int]) -> str:
    """Values scaled to block characters (all-zero: the lowest bar)."""
    if not values:
        return ""
    top = max(values)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, round(v / top * (len(SPARKS) - 1)))]
                   for v in values)


@dataclass
class StageView:
    lag: int
    rate: float  # records consumed per second since the previous refresh
    members: list[str]
    trend: list[int]
    stalled: str = ""  # "stalled: no store worker (...)" when it has lag and nobody serves


@dataclass
class Snapshot:
    at: float
    stages: dict[str, StageView]
    paused: bool
    paused_targets: list[str]
    caps: dict[str, float]
    workers: list[dict[str, Any]] = field(default_factory=list)  # per fetch worker, from store
    targets: list[dict[str, Any]] = field(default_factory=list)  # worst targets, from store
    dead: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    held: HeldWork | None = None  # live parked jobs and timers, from the broker
    #: Quarantines in force (crawl.control), as the quarantine app issued them.
    quarantines: list[Quarantine] = field(default_factory=list)


def shown_stages() -> tuple[str, ...]:
    """The pipeline's stages, then the analytics ones (the quarantine app: shown, its lag
    is analytics -- a transaction marker after its last event may show as 1)."""
    return every_stage()


class FleetView:
    """Collects snapshots; keeps a short history of each stage's lag for the trend."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.topo = topology_of(settings)
        self.probe = LagProbe(settings)
        self.admin = AdminClient(settings.kafka_common())
        self.control = ControlReader(settings, self.topo.control, default_codec())
        self.history: dict[str, deque[int]] = {st: deque(maxlen=HISTORY)
                                               for st in shown_stages()}
        self._consumed: dict[str, tuple[float, int]] = {}
        self._held: HeldWork | None = None
        self._held_at = -HELD_EVERY_S

    def snapshot(self) -> Snapshot:
        now = time.monotonic()
        notes: list[str] = []
        self.control.catch_up(5.0)
        stages: dict[str, StageView] = {}
        members = self._members(notes)
        for stage in shown_stages():
            pos = self.probe.positions(self.topo.group(stage), self.topo.inputs(stage),
                                       self.topo.partitions)
            if pos is None:
                notes.append(f"{stage}: offsets unavailable")
                continue
            lag = sum(max(0, high - start) for start, high in pos.values())
            consumed = sum(start for start, _ in pos.values())
            before = self._consumed.get(stage)
            rate = (consumed - before[1]) / (now - before[0]) \
                if before is not None and now > before[0] and consumed >= before[1] else 0.0
            self._consumed[stage] = (now, consumed)
            self.history[stage].append(lag)
            stages[stage] = StageView(lag, rate, members.get(stage, []),
                                      list(self.history[stage]))
        statuses = read_statuses(self.s.status_dir)
        found = stalls({st: v.lag for st, v in stages.items()}, statuses, members)
        held_q = quarantine_held(statuses)  # pinned work waiting out a quarantine, and until
        if held_q.jobs:
            notes.append(held_q.describe())
        for stage, why in found.items():
            stages[stage].stalled = why
        state = self.control.state
        snap = Snapshot(time.time(), stages, state.paused, sorted(state.paused_targets),
                        dict(state.caps), notes=notes, held=self._held_work(now, notes),
                        quarantines=active_quarantines(state.quarantines.values()))
        self._from_store(snap)
        return snap

    def _held_work(self, now: float, notes: list[str]) -> HeldWork | None:
        """The changelogs' live entries, read again once ``HELD_EVERY_S`` has passed."""
        if now - self._held_at >= HELD_EVERY_S:
            self._held_at = now
            try:
                self._held = read_held_work(self.s)
            except CrawlfleetError as exc:
                self._held = None
                notes.append(f"parked/timer changelogs unavailable: {exc}")
        return self._held

    def _members(self, notes: list[str]) -> dict[str, list[str]]:
        groups = {self.topo.group(st): st for st in shown_stages()}
        out: dict[str, list[str]] = {}
        try:
            futures = self.admin.describe_consumer_groups(list(groups), request_timeout=5)
            for group, fut in futures.items():
                try:
                    desc = fut.result()
                except KafkaException:
                    continue
                out[groups[group]] = sorted(m.client_id for m in desc.members)
        except KafkaException as exc:
            notes.append(f"groups unavailable: {kafka_reason(exc)}")
        return out

    def _query(self, sql: str) -> tuple[list[str], list[list[Any]]]:
        """Through the store worker (waiting briefly if it is starting), never blocking the
        screen for long: a store that stays held is a note of this refresh."""
        return run_query(self.s, sql, wait_s=STORE_WAIT_S, on_wait=lambda _: None)

    def _from_store(self, snap: Snapshot) -> None:
        window = f"ts >= now64(3) - INTERVAL {RECENT_S} SECOND"
        ok = "outcome = 'ok' AND status BETWEEN 200 AND 399"
        try:
            cols, rows = self._query(
                f"SELECT worker, any(code_revision) AS code, any(fetcher_version) AS fetcher, "  # noqa: S608
                f"uniqExact(event_id) AS requests, round(uniqExactIf(event_id, {ok}) / "
                f"requests, 3) AS success, uniqExactIf(event_id, outcome = 'blocked') AS blocked "
                f"FROM fetch_events WHERE {window} GROUP BY worker ORDER BY worker")
            snap.workers = [dict(zip(cols, r, strict=True)) for r in rows]
            cols, rows = self._query(
                f"SELECT target, uniqExact(event_id) AS requests, round(uniqExactIf(event_id, "  # noqa: S608
                f"outcome = 'blocked') / requests, 3) AS block_rate, round(uniqExactIf(event_id, "
                f"outcome = 'retry') / requests, 3) AS retry_rate FROM fetch_events "
                f"WHERE {window} GROUP BY target ORDER BY block_rate DESC, retry_rate DESC, "
                f"requests DESC LIMIT 8")
            snap.targets = [dict(zip(cols, r, strict=True)) for r in rows]
            _, rows = self._query(
                "SELECT reason, uniqExact(event_id) FROM dead_letters "  # noqa: S608
                f"WHERE failed_at >= now64(3) - INTERVAL {RECENT_S} SECOND GROUP BY reason "
                "ORDER BY 2 DESC")
            snap.dead = {str(r): int(n) for r, n in rows}
        except CrawlfleetError as exc:
            snap.notes.append(f"store unavailable: {str(exc).splitlines()[0][:120]}")

    def close(self) -> None:
        self.probe.close()
        self.control.close()


def fleet_state(snap: Snapshot) -> str:
    """The header's one word for the fleet: paused (a person said so), no workers (no stage
    has a live member), partly running (some stage has none), or running."""
    if snap.paused:
        return "paused"
    staffed = [bool(v.members) for st, v in snap.stages.items() if st in topology_stages()]
    if not any(staffed):
        return "no workers"
    everyone = all(staffed) and len(staffed) == len(topology_stages())
    return "running" if everyone else "partly running"


_STATE_STYLE = {"paused": "red", "no workers": "yellow", "partly running": "yellow",
                "running": "green"}


def render(snap: Snapshot) -> RenderableType:
    parts: list[RenderableType] = []
    word = fleet_state(snap)
    state = f"[{_STATE_STYLE[word]}]{word.upper() if word == 'paused' else word}[/]"
    head = Text.from_markup(f"crawlfleet top — fleet {state} — "
                            f"{clock_utc(snap.at)}")
    parts.append(head)
    st = Table(title="stages", title_justify="left")
    for col in ("stage", "lag", "trend", "records/s", "workers", "state"):
        st.add_column(col, justify="right" if col in ("lag", "records/s") else "left")
    for name in shown_stages():
        v = snap.stages.get(name)
        if v is None:
            st.add_row(name, "?", "", "", "", "")
            continue
        state = f"[bold red]{escape(v.stalled)}[/]" if v.stalled else \
            ("working" if v.lag else "caught up")
        st.add_row(name, str(v.lag), sparkline(v.trend), f"{v.rate:.1f}",
                   f"{len(v.members)}: {', '.join(v.members)}" if v.members else "none",
                   state)
    parts.append(st)
    if snap.held is not None:
        style = "" if snap.held.empty else "bold yellow"
        parts.append(Text(f"held by the broker: {snap.held.describe()}", style=style))
    if snap.workers:
        wt = Table(title=f"fetch workers (last {RECENT_S // 60} min)", title_justify="left")
        for col in ("worker", "code", "fetcher", "requests", "success", "blocked"):
            wt.add_column(col)
        for w in snap.workers:
            wt.add_row(*(Text(str(w[c])) for c in ("worker", "code", "fetcher", "requests",
                                              "success", "blocked")))
        parts.append(wt)
    if snap.targets:
        tt = Table(title="targets pushing back", title_justify="left")
        for col in ("target", "requests", "block_rate", "retry_rate"):
            tt.add_column(col)
        for t in snap.targets:
            tt.add_row(*(Text(str(t[c])) for c in ("target", "requests", "block_rate",
                                                    "retry_rate")))
        parts.append(tt)
    dead = ", ".join(f"{r} {n}" for r, n in snap.dead.items()) or "none"
    parts.append(Text(f"dead letters (last {RECENT_S // 60} min): {dead}"))
    parts.append(quarantine_table(snap.quarantines))
    paused = ", ".join(snap.paused_targets) or "none"
    caps = ", ".join(f"{t}={c:g}/s" for t, c in sorted(snap.caps.items())) or "none"
    parts.append(Text(f"paused targets: {paused}   live caps: {caps}"))
    for note in snap.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)


def active_quarantines(found: Any, now_ms: int | None = None) -> list[Quarantine]:
    """The quarantines of ``found`` still in force, targets first, then by scope."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    order = {"target": 0, "profile": 1, "egress": 2}
    return sorted((q for q in found if q.active(now)),
                  key=lambda q: (q.target, order.get(q.scope, 3), q.name))


def quarantine_table(quarantines: list[Quarantine]) -> RenderableType:
    """Active quarantines (``crawlfleet unquarantine`` lifts one)."""
    if not quarantines:
        return Text("active quarantines: none")
    qt = Table(title=f"active quarantines ({len(quarantines)})", title_justify="left")
    for col in ("scope", "target", "name", "until", "reason"):
        qt.add_column(col)
    for q in quarantines:
        qt.add_row(q.scope, Text(q.target), Text(q.name or "-"), clock_utc(q.until_ms / 1000),
                   Text(q.reason))
    return qt
