"""What a worker shows of itself: the status file (read by ``crawl``, ``chaos``, ``top`` and the
drain check), the work-holding gauges, liveness, and the poll-gap gauge.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streams.metrics import GaugeFn, WorkerMetrics


class PollGaps:
    """The longest time between two polls of a consumer, over the last window or two: what
    ``max.poll.interval.ms`` must outlast (a gap beyond it makes the group drop the member
    and hand its partitions on mid-batch). Exported as the ``poll_gap_ms`` gauge, which
    ``crawlfleet doctor`` checks against the setting."""

    def __init__(self, status: StatusFile, window_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.status = status
        self.window_s = window_s
        self.clock = clock
        self._last: float | None = None
        self._window_at = clock()
        self._max = self._previous = 0.0
        status.gauges.setdefault("poll_gap_ms", 0)

    def tick(self) -> None:
        """Call just before each poll."""
        now = self.clock()
        if now - self._window_at >= self.window_s:
            self._window_at, self._previous, self._max = now, self._max, 0.0
        if self._last is not None:
            self._max = max(self._max, now - self._last)
        self._last = now
        self.status.gauges["poll_gap_ms"] = int(max(self._max, self._previous) * 1000)


#: How often a worker's status file is written at most (when nothing forces it).
WRITE_EVERY_S = 0.5
#: ... and when the worker has just gone idle (it held work at the last write, none now).
IDLE_WRITE_EVERY_S = 0.05
#: A worker holding no work writes a file that would say what the last one said (but its
#: clocks) only this often: an idle worker rewrote its file twice a second for nothing
#: (issue 43). One holding work still writes every ``WRITE_EVERY_S`` (its file's age is
#: how a stalled loop is seen). Readers add the
#: time since ``wall`` to ``idle_s`` (:func:`idle_for`).
UNCHANGED_WRITE_EVERY_S = 5.0


def idle_for(status: dict[str, Any], now_wall: float | None = None) -> float:
    """Seconds the worker of a status file has been idle, now: its ``idle_s`` when
    written plus the time since (a file is not rewritten while nothing changes)."""
    now = time.time() if now_wall is None else now_wall
    return float(status.get("idle_s", 0.0)) + max(0.0, now - float(status.get("wall", now)))

#: Status gauges that mean a worker still holds work: a pipeline is drained only when every
#: worker reports zero for each (jobs in flight, queued in memory, parked on disk, waiting in
#: the timer store, partitions held back, or partitions waiting for their state's restore).
HOLDING_GAUGES = ("inflight", "queued", "parked", "timers", "held_partitions", "restoring")


def holds_work(gauges: dict[str, Any]) -> dict[str, Any]:
    """The holding gauges of a status that are non-zero (empty: holds nothing)."""
    return {k: gauges[k] for k in HOLDING_GAUGES if gauges.get(k)}


class StatusFile:
    """Writes a worker's counters to ``status_dir`` so the CLI can show progress and drain.

    The file is how ``crawl``, ``chaos`` and the tests see a worker's gauges and know the
    pipeline drained, with no metrics server needed; when ``metrics`` serves, the same
    counters and gauges are also exposed to Prometheus (read at scrape time).
    ``gauge_fns`` are gauges computed only when the file is written, not on every loop.
    """

    def __init__(self, status_dir: Path, stage: str, worker: str) -> None:
        status_dir.mkdir(parents=True, exist_ok=True)
        self.path = status_dir / f"{stage}-{worker}.json"
        self.stage = stage
        self.worker = worker
        self.counters: dict[str, int] = {}
        self.gauges: dict[str, int] = {}
        self.gauge_fns: dict[str, GaugeFn] = {}
        #: The consumer's own assignment (every topic), as librdkafka holds it: what the
        #: worker really reads, not what the group's lead-topic assignment implies.
        self.assignment: list[tuple[str, int]] = []
        #: Rebalances this worker has seen (0: it has not joined its group yet).
        self.rebalances = 0
        self.metrics = WorkerMetrics(stage, worker)
        #: What the worker waits for before it can work ("" = nothing): its broker, its
        #: store. Shown by ``crawl``, ``top`` and ``doctor``.
        self.waiting = ""
        #: Short facts a person needs next to the figures, by name (e.g. the targets a
        #: quarantine holds and why); written as they are.
        self.notes: dict[str, Any] = {}
        self._last_write = 0.0
        self._said = ""  # what the last file said, but its clocks
        self._last_activity = time.monotonic()
        self._held_when_written = False  # the last file written showed work held

    def waiting_for(self, what: str, gauge: str, waited_s: float = 0.0) -> None:
        """Say what the worker waits for (``what`` "" = no longer), in ``gauge`` (1/0) and
        ``<gauge>_s`` (seconds so far), and write the file now."""
        self.waiting = what
        self.gauges[gauge] = 1 if what else 0
        self.gauges[f"{gauge}_s"] = int(waited_s) if what else 0
        self.write(force=True)

    def assigned(self, assignment: list[tuple[str, int]]) -> None:
        """The consumer's assignment after a rebalance; written at once (readiness)."""
        self.assignment = assignment
        self.rebalances += 1
        self.write(force=True)

    def add(self, name: str, n: int = 1) -> None:
        if n:
            self.counters[name] = self.counters.get(name, 0) + n
            self._last_activity = time.monotonic()

    def write(self, force: bool = False) -> None:
        """Write the file, at most every ``WRITE_EVERY_S``; at once when the worker has
        just put down the last work it held (the crawl reads "drained" from these files
        and the broker together: a file up to half a second stale was that much of every
        crawl's drain), and at most every ``IDLE_WRITE_EVERY_S`` for that."""
        now = time.monotonic()
        since = now - self._last_write
        went_idle = self._held_when_written and not holds_work(self.gauges)
        if not force and since < WRITE_EVERY_S \
                and not (went_idle and since >= IDLE_WRITE_EVERY_S):
            return
        for name, fn in self.gauge_fns.items():
            self.gauges[name] = fn()
        snap = self.snapshot(now)
        said = json.dumps({k: v for k, v in snap.items() if k not in ("idle_s", "wall")},
                          sort_keys=True)
        if not force and said == self._said and since < UNCHANGED_WRITE_EVERY_S \
                and not holds_work(self.gauges):
            return
        self._last_write, self._said = now, said
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snap))
        tmp.replace(self.path)
        self._held_when_written = bool(holds_work(self.gauges))

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """What the file holds (written by :meth:`write`; read live by ``/ready``)."""
        now = time.monotonic() if now is None else now
        return {"stage": self.stage, "worker": self.worker, "pid": os.getpid(),
                "host": _HOST, "counters": dict(self.counters), "gauges": dict(self.gauges),
                "idle_s": round(now - self._last_activity, 3), "wall": time.time(),
                "metrics_port": self.metrics.port, "waiting": self.waiting,
                "assignment": [list(tp) for tp in self.assignment],
                "rebalances": self.rebalances, "notes": self.notes}

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.metrics.close()


_HOST = socket.gethostname()


def status_alive(status: dict[str, Any]) -> bool | None:
    """Whether the process that wrote ``status`` still runs: None when it cannot be told
    from here (written on another host)."""
    if status.get("host", _HOST) != _HOST:
        return None
    pid = status.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    try:  # a killed child its parent has not reaped yet is a zombie: dead all the same
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_statuses(status_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(status_dir.glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue  # being replaced right now
    return out
