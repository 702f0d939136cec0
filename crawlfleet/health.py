"""What holds a fleet still: stalled stages, and work only the broker still holds.

Two things a healthy-looking fleet can hide, each read from where the truth lives:

- a **stalled** stage: its input has lag and none of its workers serves -- there is none,
  or only dead ones (a status file whose process is gone: kill -9 leaves it behind), or
  only ones that wait (for their broker, for their store, which they say in their status).
  ``crawl`` and ``top`` show it within seconds, with why, instead of waiting silently;
- **held work**: the live entries of ``crawl.parked`` and ``crawl.timers`` as the broker
  holds them (:func:`infra.live_state.live_entries`). A job parked or waiting on a timer is
  work even when no worker has it in memory, so a pipeline is drained only when both
  changelogs are empty *and* settled (no open transaction), whatever the gauges say. Each
  read is a full read of a compacted topic: callers read it at a modest rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.config import Settings
from infra.live_state import LiveEntries, live_entries
from infra.topics import topology_of
from producers.control import end_held
from streams.status import status_alive

#: A stage must look stalled this long before it is shown so (a restarted worker takes a
#: second or two to write its first status).
STALL_GRACE_S = 2.0

SERVING, WAITING, DEAD = "serving", "waiting", "dead"


@dataclass(frozen=True)
class WorkerState:
    stage: str
    worker: str
    state: str  # SERVING, WAITING or DEAD
    detail: str = ""


def worker_state(status: dict[str, Any]) -> WorkerState:
    """One worker's state from its status file (a process on another host: serving)."""
    stage, worker = str(status.get("stage", "?")), str(status.get("worker", "?"))
    if status_alive(status) is False:
        return WorkerState(stage, worker, DEAD, f"pid {status.get('pid')} is gone")
    waiting = str(status.get("waiting") or "")
    if waiting:
        return WorkerState(stage, worker, WAITING, waiting)
    return WorkerState(stage, worker, SERVING)


def stalls(lags: dict[str, int], statuses: list[dict[str, Any]],
           members: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Stage -> "stalled: no <stage> worker (why)" for each stage with lag and no worker
    that serves.

    ``statuses`` are the local status files; ``members`` (``top``) the stages' group members
    from Kafka, which count as serving unless a local status says their process is dead or
    waiting (a killed static member stays in its group until its session times out).
    """
    states = [worker_state(s) for s in statuses]
    out: dict[str, str] = {}
    for stage, lag in lags.items():
        if lag <= 0:
            continue
        mine = {w.worker: w for w in states if w.stage == stage}
        serving = {w for w, st in mine.items() if st.state == SERVING}
        if members is not None:
            serving |= {m for m in members.get(stage, []) if m not in mine}
        if serving:
            continue
        why = "; ".join(f"{st.worker} {st.state}: {st.detail}" for st in mine.values())
        out[stage] = f"stalled: no {stage} worker" + (f" ({why})" if why else "")
    return out


class StallWatch:
    """Shows a stall once it has lasted ``grace_s`` (0: at once)."""

    def __init__(self, grace_s: float = STALL_GRACE_S) -> None:
        self.grace_s = grace_s
        self._since: dict[str, float] = {}

    def update(self, found: dict[str, str], now: float) -> dict[str, str]:
        self._since = {stage: self._since.get(stage, now) for stage in found}
        return {stage: why for stage, why in found.items()
                if now - self._since[stage] >= self.grace_s}


@dataclass(frozen=True)
class HeldWork:
    """Live entries of the parked and timer changelogs, as the broker holds them."""

    parked: LiveEntries
    timers: LiveEntries

    @property
    def empty(self) -> bool:
        """Nothing held and nothing in flight: the only state in which a crawl is drained."""
        return all(c.total == 0 and c.settled for c in (self.parked, self.timers))

    def describe(self) -> str:
        """E.g. "crawl.parked 77 live (p2 77), crawl.timers 0"; open transactions named."""
        parts = []
        for name, c in (("crawl.parked", self.parked), ("crawl.timers", self.timers)):
            where = ", ".join(f"p{p} {n}" for p, n in sorted(c.counts.items()) if n)
            text = f"{name} {c.total} live" + (f" ({where})" if where else "")
            if c.unsettled:
                text += " + open transaction on " + ", ".join(f"p{p}" for p in
                                                               sorted(c.unsettled))
            parts.append(text)
        return ", ".join(parts)


class HeldRecheck:
    """When a calm crawl reads its changelogs again while they held work: after
    ``first_s``, then twice as long each time they still hold some, up to ``most_s``.
    What holds a crawl's end is most often a transaction still committing, gone within a
    tick (a fixed 2 s wait was that much of such a crawl's drain); parked work waiting for
    minutes is read every ``most_s``. Nothing held (or nothing read yet): read every tick."""

    def __init__(self, first_s: float, most_s: float) -> None:
        self.first_s, self.most_s = first_s, most_s
        self.wait_s = first_s
        self._read_at: float | None = None

    def due(self, now: float, held: HeldWork | None) -> bool:
        return held is None or held.empty or self._read_at is None \
            or now - self._read_at >= self.wait_s

    def reading(self, now: float, held_before: HeldWork | None) -> None:
        """A read starts now; ``held_before`` is what the previous one found."""
        if held_before is not None and not held_before.empty and self._read_at is not None:
            self.wait_s = min(2 * self.wait_s, self.most_s)
        self._read_at = now

    def reset(self) -> None:
        """The crawl is busy again: the next calm starts over."""
        self.wait_s, self._read_at = self.first_s, None


def read_held_work(settings: Settings, timeout_s: float = 10.0) -> HeldWork:
    """Both changelogs read to a stable end (raises InfraError if Kafka cannot be asked)."""
    topo = topology_of(settings)
    return HeldWork(live_entries(settings, topo.parked, topo.partitions, timeout_s),
                    live_entries(settings, topo.timers, topo.partitions, timeout_s))


@dataclass(frozen=True)
class QuarantineHeld:
    """Jobs the fetch workers hold because of a quarantine (their ``quarantine_held``
    gauge and per-target notes, consumers/fetch/quarantine_holds)."""

    jobs: int
    where: dict[str, str]  # target -> "N jobs until ..."

    def describe(self) -> str:
        shown = "; ".join(f"{t} {w}" for t, w in sorted(self.where.items())[:5])
        more = f"; +{len(self.where) - 5} targets" if len(self.where) > 5 else ""
        return f"{self.jobs} jobs held by quarantines ({shown}{more})"


def quarantine_held(statuses: list[dict[str, Any]]) -> QuarantineHeld:
    jobs, where = 0, dict[str, str]()
    for s in statuses:
        if s.get("stage") != "fetch":
            continue
        jobs += int(s.get("gauges", {}).get("quarantine_held", 0) or 0)
        where.update(s.get("notes", {}).get("quarantine_held") or {})
    return QuarantineHeld(jobs, where)


def only_quarantine_holds(statuses: list[dict[str, Any]], lags: dict[str, int],
                          analytics: tuple[str, ...] = ()) -> bool:
    """Whether everything the fleet still holds is held by a quarantine: fetch's lag is
    all the fleet's work, and every job each fetch worker has (queued) is held (nothing in
    flight, parked or on a timer, no other stage behind or holding work). Then a one-off
    crawl's drain would only wait the quarantines out."""
    held = quarantine_held(statuses)
    if held.jobs <= 0:
        return False
    if any(v for stage, v in lags.items() if stage != "fetch" and stage not in analytics):
        return False
    for s in statuses:
        if s.get("stage") in analytics:
            continue
        g = s.get("gauges", {})
        busy = {k: v for k, v in g.items()
                if k in ("inflight", "parked", "timers", "held_partitions", "restoring") and v}
        if busy or s.get("waiting"):
            return False
        queued = int(g.get("queued", 0) or 0)
        if s.get("stage") == "fetch":  # queued for a target, or waiting for an identity
            waiting = int(g.get("identity_waiting", 0) or 0)
            if queued + waiting != int(g.get("quarantine_held", 0) or 0):
                return False
        elif queued:
            return False
    return True


#: Looks in a row that must find only quarantine-held work before a crawl ends it (a job
#: between two queues for a moment is not "held").
HELD_ONLY_LOOKS = 3


class QuarantineDrain:
    """A one-off crawl's view of quarantine-held work: the note to show while some is
    held, and the one moment to end it (a deployed fleet has no such view: it waits)."""

    def __init__(self, settings: Settings, analytics: tuple[str, ...]) -> None:
        self.settings, self.analytics = settings, analytics
        self.looks = 0
        self.ended = False

    def look(self, statuses: list[dict[str, Any]], lags: dict[str, int]
             ) -> tuple[str | None, str | None]:
        """(the progress note or None, what to print when the held jobs were ended now:
        once, when they are all the crawl still waits on)."""
        held = quarantine_held(statuses)
        note = held.describe() if held.jobs else None
        self.looks = self.looks + 1 if only_quarantine_holds(statuses, lags,
                                                              self.analytics) else 0
        if self.looks < HELD_ONLY_LOOKS or self.ended:
            return note, None
        self.ended = True
        end_held(self.settings)
        return note, (f"{note}, and nothing else left: ending them as dead letters "
                      "`quarantined` (a one-off crawl does not wait its quarantines out)")
