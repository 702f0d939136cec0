"""The stage processes of a crawl: which run (the plan), how they start and stop.

Stages run as separate processes exactly as a deployment runs them (``crawlfleet worker
STAGE``, here through the lean ``crawlfleet.worker_main``), so the all-in-one exercises the
real pipeline. A stage process that dies is restarted with the same worker id, which fences
its former self.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from core.config import TABLE_FIELDS, Secret, Settings
from schemas.stages import analytics_stages, every_stage, stages, stages_where
from streams.status import read_statuses

PARTITIONS_PER_WORKER = 4
#: Stages declared ``start_late`` begin once a fetch worker has joined its group (at most
#: ``LATE_START_S`` after the others; ``worker_main --defer-s``): in a crawl's first seconds
#: they have nothing to do, and five interpreters importing at once on two cores delay the
#: first request by the start-up of the two it does not need. They read their inputs from
#: the earliest offset: nothing is missed. Not later (tried: after the first request): the
#: quarantine app still starting while the first blocks came in let a banned profile ask
#: again after its quarantine was decided.
LATE_START_S = 3.0
#: How long a stopping crawl waits for an analytics worker (the quarantine app) to exit.
ANALYTICS_STOP_S = 0.5


@dataclass(frozen=True)
class Plan:
    fetch_workers: int = 1
    parse_workers: int = 1
    retry_workers: int = 1
    store_workers: int = 1  # embedded chDB allows exactly one store process

    #: Workers of each stage declared in ``stage_modules`` (the topology's others).
    other_workers: int = 1
    #: Quarantine apps (faust; analytics: started and restarted, never waited on).
    quarantine_workers: int = 1

    def workers(self, stage: str) -> int:
        """Workers of ``stage``: its ``<stage>_workers`` field, else ``other_workers`` (an
        analytics stage without a field of its own: one)."""
        default = 1 if stage in analytics_stages() else self.other_workers
        return int(getattr(self, f"{stage}_workers", default))

    def counts(self) -> dict[str, int]:
        """Workers per stage, every stage of the topology (the pipeline's and declared)."""
        return {stage: self.workers(stage) for stage in stages()}

    def processes(self) -> dict[str, int]:
        """Workers per stage to start: :meth:`counts` and the analytics stages."""
        return {stage: self.workers(stage) for stage in every_stage()}

    def partitions(self) -> int:
        """Partitions for topics that only this plan's processes will ever consume.

        A partition is a group's unit of parallelism, and every transaction costs the broker
        a produce request and a verification per partition it touches; four per worker of
        the largest stage leave room to rebalance a dead worker's share evenly.
        """
        return PARTITIONS_PER_WORKER * max(self.counts().values())


def settings_env(settings: Settings) -> dict[str, str]:
    """CRAWLFLEET_* variables that recreate ``settings`` in a child process."""
    env: dict[str, str] = {}
    for f in fields(Settings):
        v = getattr(settings, f.name)
        if isinstance(v, Secret):
            v = v.get()
        elif f.name in TABLE_FIELDS:  # tables of tables travel as JSON
            v = json.dumps(v)
        elif isinstance(v, tuple):
            v = ",".join(str(i) for i in v)
        elif isinstance(v, dict):
            sep = "|" if any(isinstance(x, str) for x in v.values()) else ","
            v = sep.join(f"{k}={x}" for k, x in v.items())
        elif isinstance(v, bool):
            v = "true" if v else "false"
        env[f"CRAWLFLEET_{f.name.upper()}"] = str(v)
    return env


class Fleet:
    """The stage processes of one crawl; restarts any that die unexpectedly."""

    def __init__(self, settings: Settings, plan: Plan, log_dir: Path) -> None:
        self.settings = settings
        self.plan = plan
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts = 0
        self._env = {**os.environ, **settings_env(settings)}
        self._env.pop("CRAWLFLEET_CONFIG", None)
        #: When the workers were started (monotonic, and Unix time); 0.0 before.
        self.started_at = self.started_wall = 0.0
        self._signalled: dict[str, float] = {}  # worker → when it was first told to stop

    @property
    def started(self) -> bool:
        return bool(self.procs)

    def start(self) -> None:
        self.started_at, self.started_wall = time.monotonic(), time.time()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for stage, n in self.plan.processes().items():
            for i in range(n):
                self._spawn(f"{stage}-{i}", stage)

    def _spawn(self, wid: str, stage: str, restart: bool = False) -> None:
        log = (self.log_dir / f"{wid}.log").open("ab")
        # A late stage's first start waits (in its own process, before its imports) for a
        # fetch worker to join; a restart does not.
        late = stage in stages_where("start_late") and not restart
        defer = ["--defer-s", str(LATE_START_S)] if late else []
        self.procs[wid] = subprocess.Popen(
            [sys.executable, "-m", "crawlfleet.worker_main", stage, "--worker-id", wid, *defer],
            env=self._env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def heal(self) -> None:
        """Restart the workers that died."""
        for wid, p in list(self.procs.items()):
            if p.poll() is not None:
                self.restarts += 1
                self._spawn(wid, wid.rsplit("-", 1)[0], restart=True)

    def signal(self, but: tuple[str, ...] = ()) -> None:
        """Ask every worker (but those of the stages ``but``) to stop; waits for none."""
        for wid, p in self.procs.items():
            if p.poll() is None and wid.rsplit("-", 1)[0] not in but:
                p.send_signal(signal.SIGTERM)
                self._signalled.setdefault(wid, time.monotonic())

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every worker and wait up to ``timeout_s`` for each (then SIGKILL); an
        analytics worker gets ``ANALYTICS_STOP_S``, or none before its status says it
        joined: at least once by design, it redoes from its committed offsets whatever a
        kill cuts short, and a faust app still starting up can take seconds to stop. A
        grace counts from the worker's first SIGTERM (:meth:`signal` may have sent it
        earlier)."""
        self.signal()
        now = time.monotonic()
        analytics = analytics_stages()
        joined = self._joined()
        for wid, p in self.procs.items():
            stage = wid.rsplit("-", 1)[0]
            # An analytics worker that has not joined its group yet has read nothing: no
            # grace (a faust app still starting up would use all of it).
            grace = timeout_s if stage not in analytics \
                else ANALYTICS_STOP_S if wid in joined else 0.0
            try:
                p.wait(max(0.1 if grace else 0.0,
                           self._signalled.get(wid, now) + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _joined(self) -> set[str]:
        """The workers whose status names partitions they were assigned."""
        return {str(st.get("worker")) for st in read_statuses(self.settings.status_dir)
                if st.get("assignment")}
