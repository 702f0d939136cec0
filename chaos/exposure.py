"""How much work a round's faults may make the fleet redo: the over-apply bound.

A page is requested twice only when a fetch worker drops work it had already requested:
killed, fenced, its transaction aborted, its partitions lost or revoked. What it drops is
what it held at that moment: its requests in flight plus its finished-but-uncommitted
results (the status gauge ``uncommitted``). So every *drop* adds to the bound

    inflight + uncommitted    (from the worker's status file, read just before the drop)
    + the page requests the site received between that read and the drop

The last term is what the worker may have sent after its file was written; the site's own
log counts it exactly (every host, so it can only over-count). A stop (SIGTERM) drops at
the worker's exit, not at the ask: its final commit may wait on a broker until it is
killed. A kill is a drop we cause and sample right before; the others show in the status
file as a new pid or a higher ``aborted_txns``/``fenced``/``lost_partitions``/
``revoked_partitions``/``internal_errors`` counter, and then the figures are the largest
the worker reported since its previous drop.

The store's raw rows beyond one per key come from the same thing at the store: a store
worker that inserted rows and died (or aborted) before committing their offsets inserts
them again. Its bound is the sum of the store's ``uncommitted`` at its drops.

The ``uncommitted`` gauge is new. While a worker's status lacks it, it counts as 0 (the
report says so) and the bound used is the older exposure estimate: each fetch victim's
in-flight + queued, plus twice the most the fetch fleet held within a session timeout of
each fetch kill or broker fault (one rebalance for the victim's replacement, one for the
dead member's expiry).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.stages import stages_where

#: Status counters that each mean "this worker dropped the work it held".
DROP_COUNTERS = ("aborted_txns", "fenced", "lost_partitions", "revoked_partitions",
                 "internal_errors")
#: Rebalances one fetch kill can cause without static membership (legacy estimate).
REBALANCES_PER_FETCH_KILL = 2


@dataclass(frozen=True)
class Held:
    """What one worker's status file said it held."""

    worker: str
    stage: str
    pid: int
    wall: float  # when the file was written (the worker's time.time())
    inflight: int
    queued: int
    uncommitted: int | None  # None: the worker does not report the gauge
    drops: int  # sum of DROP_COUNTERS

    @property
    def exposed(self) -> int:
        return self.inflight + (self.uncommitted or 0)


def held_of(status: dict[str, Any]) -> Held:
    g = status.get("gauges", {})
    c = status.get("counters", {})
    unc = g.get("uncommitted")
    return Held(worker=str(status.get("worker", "")), stage=str(status.get("stage", "")),
                pid=int(status.get("pid", 0)), wall=float(status.get("wall", 0.0)),
                inflight=int(g.get("inflight", 0)), queued=int(g.get("queued", 0)),
                uncommitted=None if unc is None else int(unc),
                drops=sum(int(c.get(k, 0)) for k in DROP_COUNTERS))


@dataclass
class Drop:
    """One moment a worker lost what it held, with what that was."""

    worker: str
    stage: str
    cause: str  # kill | state_wipe | store_restart | exited | counter names
    wall: float  # when it happened (for a revealed drop: the sample that showed it)
    since_wall: float  # when the figures below were written
    inflight: int
    queued: int
    uncommitted: int | None

    @property
    def exposed(self) -> int:
        return self.inflight + (self.uncommitted or 0)


@dataclass
class Bound:
    """The round's over-apply bounds and how they were made."""

    requests: int  # Σ fetch drops' in-flight + uncommitted + site requests since their read
    store_rows: int  # Σ store drops' uncommitted
    legacy: int  # the older exposure estimate (victims' load + 2 x fleet load in windows)
    gauge_missing: bool  # some fetch drop's worker did not report `uncommitted`
    drops: int
    drops_by_cause: dict[str, int] = field(default_factory=dict)
    store_gauge_missing: bool = False  # some store drop's worker did not report it

    @property
    def used(self) -> int:
        """The bound the round is judged by: the uncommitted-based one when every drop had
        the gauge, the older estimate otherwise (with 0 for the gauge, the bound could only
        be too tight)."""
        return max(self.requests, self.legacy) if self.gauge_missing else self.requests

    @property
    def basis(self) -> str:
        return ("legacy exposure (uncommitted gauge missing, counted as 0)"
                if self.gauge_missing else "victims' in-flight + uncommitted at their drops")


class Exposure:
    """Watches every worker's status between faults and records each drop.

    ``observe`` is called on every tick with all status files; ``on_kill`` right before a
    worker is killed (with a fresh read of its status). ``window_s`` is how long after a
    fetch kill or broker fault the legacy estimate keeps widening (session timeout +
    restart allowance).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.drops: list[Drop] = []
        self._last: dict[str, Held] = {}
        self._peak: dict[str, Held] = {}  # the largest exposure since the worker's last drop
        self._killed: set[str] = set()  # killed by us: its next pid is not a drop of its own
        #: legacy windows: key -> [end wall, most the fetch fleet held within it]
        self._windows: dict[str, list[float]] = {}
        self._legacy = 0

    # --- observation ----------------------------------------------------------------------

    def observe(self, statuses: Iterable[dict[str, Any]], now_wall: float) -> None:
        fleet = 0
        for st in statuses:
            h = held_of(st)
            if h.stage in stages_where("sends_requests"):
                fleet += h.inflight + h.queued
            prev = self._last.get(h.worker)
            if prev is not None and h.wall < prev.wall:
                continue  # an older file than one already read
            if prev is not None and h.pid != prev.pid:
                if h.worker in self._killed:
                    self._killed.discard(h.worker)
                else:
                    self._drop(prev, "exited", h.wall)
                self._peak.pop(h.worker, None)
            elif prev is not None and h.drops > prev.drops:
                self._drop(prev, "dropped", h.wall)
                self._peak.pop(h.worker, None)
            self._last[h.worker] = h
            peak = self._peak.get(h.worker)
            if peak is None or h.exposed >= peak.exposed:
                self._peak[h.worker] = h
        for w in self._windows.values():
            if w[0] >= now_wall:
                w[1] = max(w[1], fleet)

    def on_kill(self, status: dict[str, Any] | None, worker: str, stage: str, cause: str,
                now_wall: float) -> Drop:
        """Record a kill we are about to send; ``status`` is the victim's fresh read."""
        h = held_of(status) if status is not None else None
        drop = Drop(worker=worker, stage=stage, cause=cause, wall=now_wall,
                    since_wall=h.wall if h else now_wall, inflight=h.inflight if h else 0,
                    queued=h.queued if h else 0, uncommitted=h.uncommitted if h else None)
        self.drops.append(drop)
        self._killed.add(worker)
        self._peak.pop(worker, None)
        if stage in stages_where("sends_requests"):
            self._legacy += drop.inflight + drop.queued
            self.open_window(now_wall)
        return drop

    def open_window(self, now_wall: float) -> str:
        """A fault that can make the whole fetch fleet drop its work (a fetch kill's
        rebalances, a broker fault) opens a window of the legacy estimate; its key."""
        key = f"w{len(self._windows)}"
        self._windows[key] = [now_wall + self.window_s, float(self.fleet_load())]
        return key

    def extend(self, key: str, now_wall: float) -> None:
        """A fault still going on: its window lasts until ``window_s`` after it is over."""
        w = self._windows[key]
        w[0] = max(w[0], now_wall + self.window_s)

    def fleet_load(self) -> int:
        return sum(h.inflight + h.queued for h in self._last.values()
                   if h.stage in stages_where("sends_requests"))

    def _drop(self, prev: Held, cause: str, seen_wall: float) -> None:
        peak = self._peak.get(prev.worker, prev)
        unc = None if prev.uncommitted is None or peak.uncommitted is None else \
            max(prev.uncommitted, peak.uncommitted)
        self.drops.append(Drop(worker=prev.worker, stage=prev.stage, cause=cause,
                               wall=seen_wall, since_wall=prev.wall,
                               inflight=max(prev.inflight, peak.inflight),
                               queued=max(prev.queued, peak.queued), uncommitted=unc))

    # --- the bound ------------------------------------------------------------------------

    def bound(self, requests_between: Callable[[float, float], int]) -> Bound:
        """The bounds, given the site's request count in a wall-clock window."""
        legacy = self._legacy + REBALANCES_PER_FETCH_KILL * int(
            sum(w[1] for w in self._windows.values()))
        req = 0
        store = 0
        missing = store_missing = False
        by_cause: dict[str, int] = {}
        for d in self.drops:
            by_cause[d.cause] = by_cause.get(d.cause, 0) + 1
            if d.stage in stages_where("sends_requests"):
                missing = missing or d.uncommitted is None
                req += d.exposed + requests_between(d.since_wall, d.wall)
            elif d.stage in stages_where("store_owner"):
                store_missing = store_missing or d.uncommitted is None
                store += d.uncommitted or 0
        return Bound(requests=req, store_rows=store, legacy=legacy, gauge_missing=missing,
                     drops=len(self.drops), drops_by_cause=by_cause,
                     store_gauge_missing=store_missing)


def repeats_by_fault(requests: list[tuple[float, str]],
                     faults: list[tuple[float, str]]) -> dict[str, int]:
    """Each repeated page request (a URL's second request or later), attributed to the
    latest fault before it: which fault made the fleet redo work, and how much.

    ``requests`` are (time, URL) in the site's log order; ``faults`` (time, label) on the
    same clock. A repeat before any fault counts under ``"before any fault"``.
    """
    order = sorted(faults)
    times = [t for t, _ in order]
    seen: set[str] = set()
    out: dict[str, int] = {}
    for t, url in requests:
        if url not in seen:
            seen.add(url)
            continue
        i = bisect.bisect_right(times, t)
        label = order[i - 1][1] if i else "before any fault"
        out[label] = out.get(label, 0) + 1
    return out
