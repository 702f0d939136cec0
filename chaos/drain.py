"""Is a chaos round drained? Asked of the broker, not only of the workers' gauges.

Gauges say what a worker holds in memory; a job parked on disk or waiting in a timer store
whose worker died (or dropped it) is work no gauge shows. So a round counts as drained only
when every process is up, every worker is idle with nothing held, no stage has lag, *and*
every stage's state changelog (``crawl.parked``, ``crawl.timers``, a declared stage's own)
holds no live entry, read to a stable end (:func:`infra.live_state.live_entries`; an open
transaction on a partition makes the count unsettled, so not drained). The cheap checks go
first; the changelogs are read only when everything else is calm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from core.config import Settings
from core.errors import InfraError
from crawlfleet.crawl import IDLE_S
from crawlfleet.fleet import Fleet
from infra.lag import LagProbe
from infra.live_state import LiveEntries, live_entries
from schemas.stages import analytics_stages, stage_spec, stages
from schemas.topics import Topology
from streams.status import holds_work, idle_for


@dataclass
class BrokerState:
    """Live entries of every stage's state changelogs, as the broker holds them, by the
    changelog's name in the topology (``crawl.parked``, ``crawl.timers``, a declared
    stage's own)."""

    live: dict[str, int] = field(default_factory=dict)
    unsettled: dict[str, list[int]] = field(default_factory=dict)  # changelog -> partitions
    error: str = ""

    @property
    def empty(self) -> bool:
        return not any(self.live.values()) and not self.unsettled and not self.error

    def describe(self) -> str:
        parts = [f"{name} holds {n} live entries" for name, n in self.live.items() if n]
        parts += [f"{name} unsettled on partitions {ps}" for name, ps in self.unsettled.items()]
        if self.error:
            parts.append(self.error)
        return "; ".join(parts) or "no live entries in any state changelog"


def broker_state(settings: Settings, topo: Topology, timeout_s: float = 10.0) -> BrokerState:
    """Count the live entries of every stage's state changelogs on the broker (as the
    topology declares them: ``StageSpec.work_stores``)."""
    out = BrokerState()
    try:
        for stage in stages():
            for store in stage_spec(stage).work_stores:
                name = store.changelog
                live: LiveEntries = live_entries(settings, topo.prefix + name, topo.partitions,
                                                 timeout_s)
                out.live[name] = live.total
                if live.unsettled:
                    out.unsettled[name] = sorted(live.unsettled)
    except InfraError as exc:
        out.error = f"changelogs unreadable: {exc}"
    return out


#: A live worker whose status file is this much older than its loop writes it (every
#: 0.5 s, and at least once per 0.2-s poll when idle) is stuck inside a call: say so.
SILENT_S = 15.0


def unsettled_gauges(statuses: list[dict[str, Any]], lags: dict[str, int],
                     workers: int, now: float | None = None) -> str:
    """What the lags and gauges say keeps the pipeline busy ('' when they say calm).

    A status file that stopped being written is named as such (``silent``): its gauges
    are the last the worker wrote before its loop stopped turning, not what it holds.
    """
    now = time.time() if now is None else now
    out = [f"{k} lag {v}" for k, v in lags.items() if v != 0]
    if len(statuses) < workers:
        out.append(f"{len(statuses)} of {workers} status files")
    for st in statuses:
        silent = now - st.get("wall", now)
        if silent >= SILENT_S:
            out.append(f"{st.get('worker')} silent {silent:.0f}s (its loop has not written "
                       f"its status since)")
            continue
        busy = holds_work(st.get("gauges", {}))
        idle = idle_for(st, now)
        if busy or idle < IDLE_S:
            out.append(f"{st.get('worker')} idle {idle:.1f}s {busy or ''}".rstrip())
    return "; ".join(out)


def silent_workers(statuses: list[dict[str, Any]], now: float | None = None) -> set[str]:
    """The workers whose status file stopped being written (see :data:`SILENT_S`)."""
    now = time.time() if now is None else now
    return {str(st.get("worker")) for st in statuses if now - st.get("wall", now) >= SILENT_S}


def stuck_workers(statuses: list[dict[str, Any]], lags: dict[str, int],
                  silent: set[str]) -> list[str]:
    """The workers to look at when a round does not drain: every worker of a stage with
    lag, and every ``silent`` one."""
    lagging = {k for k, v in lags.items() if v}
    return sorted({str(st.get("worker")) for st in statuses if st.get("stage") in lagging}
                  | silent)


class DrainCheck:
    """One round's drain test: processes, gauges and lags, then the broker's changelogs."""

    def __init__(self, settings: Settings, topo: Topology, fleet: Fleet) -> None:
        self.s = settings
        self.topo = topo
        self.fleet = fleet
        self.probe = LagProbe(settings)
        self.why = ""  # why the last check said "not drained"
        self.stuck: list[str] = []  # the workers the last check found lagging or silent
        self.silent: set[str] = set()  # of those, the ones whose loop stopped turning
        self.last_broker: BrokerState | None = None

    def drained(self, statuses: list[dict[str, Any]]) -> bool:
        dead = [w for w, p in self.fleet.procs.items() if p.poll() is not None]
        if dead:
            self.why = f"exited, restarting: {dead}"
            return False
        lags = self.probe.stage_lags(self.topo)
        # The quarantine app (analytics, at least once) is never waited on: its lag and
        # gauges are no work of the crawl (stage_lags covers the pipeline's stages only).
        statuses = [st for st in statuses if st.get("stage") not in analytics_stages()]
        busy = unsettled_gauges(statuses, lags, sum(self.fleet.plan.counts().values()))
        self.silent = silent_workers(statuses)
        self.stuck = stuck_workers(statuses, lags, self.silent)
        if busy:
            self.why = busy
            return False
        state = broker_state(self.s, self.topo)
        self.last_broker = state
        if not state.empty:
            self.why = "gauges and lags calm, but " + state.describe()
            return False
        self.why = ""
        return True

    def close(self) -> None:
        self.probe.close()
