"""The faults themselves: each one a small thread (or call) that does one thing to the
cluster or the fleet and records what it did.

Faults that last (a broker down for a while, a frozen broker, a whole-cluster restart, a
store restart under readers) run off the round's main loop, which keeps restarting dead
workers, watching gauges and sending worker kills meanwhile. Every one of them undoes what
it did even when cancelled: a frozen broker is always thawed, readers always stopped.
Worker kills go through the round's ``kill`` callback, so each is sampled (status gauges)
right before its signal, whoever sends it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from chaos.fault_plan import ROLLING_RESTART, STATE_WIPE, STORE_RESTART
from chaos.report import FaultRecord
from core.config import Settings
from core.errors import CrawlfleetError
from crawlfleet.crawl import settings_env
from infra import kafka_local
from schemas.stages import stage_spec
from streams.state_store import store_dir

#: A killed broker stays down this long before it is started again.
BROKER_DOWN_S = 10.0
#: How long a restarted broker may take to answer before the fault counts as not injected.
#: A JVM restart on this 2-core machine takes ~10-30 s, but one in a stalled phase of the
#: VM took 72 s (a full suite, 2026-12-05: multi-second gaps between its log lines), and the
#: rolling restart gave up on it at 60 s as if the broker had not come back.
BROKER_START_WAIT_S = 150.0
#: A frozen broker stays stopped this much longer than the consumers' session timeout, so
#: every session it coordinates expires and its partitions' leadership moves.
FREEZE_MARGIN_S = 5.0
#: Every broker stays down this long in a whole-cluster restart.
ALL_DOWN_S = 3.0
#: Readers keep querying this long after the store worker was killed.
READERS_S = 20.0
#: The query the readers run, as an operator watching progress would.
READER_SQL = "SELECT count() FROM pages"

KillFn = Callable[[str, str], None]  # (worker id, cause): sample, SIGKILL, record


class FaultThread(threading.Thread):
    """One lasting fault; ``record`` says what happened (``error`` if it could not)."""

    def __init__(self, record: FaultRecord, t0: float) -> None:
        super().__init__(name=f"chaos-{record.kind}", daemon=True)
        self.record = record
        self.t0 = t0
        self.cancel = threading.Event()

    def run(self) -> None:
        try:
            self.inject()
            self.record.ended_at_s = round(time.monotonic() - self.t0, 2)
        except (CrawlfleetError, OSError, subprocess.SubprocessError) as exc:
            # Recorded, shown in the report, and the fault counts as not injected: the
            # crawl must survive a node that did not come back anyway.
            self.record.error = str(exc).splitlines()[0] if str(exc) else repr(exc)

    def inject(self) -> None:
        raise NotImplementedError


class BrokerKill(FaultThread):
    """kill -9 one broker, keep it down :data:`BROKER_DOWN_S`, start it again."""

    def __init__(self, record: FaultRecord, t0: float, home: Path, node: int) -> None:
        super().__init__(record, t0)
        self.home, self.node = home, node

    def inject(self) -> None:
        kafka_local.stop_node(self.node, base_dir=self.home, hard=True)
        self.cancel.wait(BROKER_DOWN_S)
        kafka_local.start_node(self.node, base_dir=self.home, timeout_s=BROKER_START_WAIT_S)


class BrokerFreeze(FaultThread):
    """SIGSTOP one broker for longer than the session timeout, then SIGCONT: a broker that
    hangs (GC pause, stuck disk) rather than dies. Its sockets stay open and silent."""

    def __init__(self, record: FaultRecord, t0: float, home: Path, node: int,
                 freeze_s: float) -> None:
        super().__init__(record, t0)
        self.home, self.node, self.freeze_s = home, node, freeze_s

    def inject(self) -> None:
        pid = kafka_local.freeze_node(self.node, base_dir=self.home)
        try:
            self.cancel.wait(self.freeze_s)
        finally:
            kafka_local.thaw_node(self.node, base_dir=self.home)
        self.record.detail = f"pid {pid} stopped {self.freeze_s:g}s"


class RestartAll(FaultThread):
    """Every broker killed at once and all started again: the whole cluster goes away."""

    def __init__(self, record: FaultRecord, t0: float, home: Path) -> None:
        super().__init__(record, t0)
        self.home = home

    def inject(self) -> None:
        began = time.monotonic()
        kafka_local.restart_all(self.home, hard=True, down_s=ALL_DOWN_S,
                                timeout_s=BROKER_START_WAIT_S)
        self.record.detail = f"all brokers back after {time.monotonic() - began:.1f}s"


#: After each step of a rolling restart: a broker's replicas catch up, a worker rejoins.
ROLL_SETTLE_S = 5.0
#: The longest a rolling restart waits for a stopped worker to be serving again.
ROLL_WORKER_WAIT_S = 90.0


class RollingRestart(FaultThread):
    """A deployment's rolling restart: every broker stopped cleanly (SIGTERM) and started
    again, one after another, then every worker of every stage stopped cleanly (``stop``:
    it commits what it finished and leaves) and restarted by the fleet under its own id,
    one after another, each back before the next goes. ``paces`` records the requests per
    second the site served during each step, for the report (never judged)."""

    def __init__(self, record: FaultRecord, t0: float, home: Path, nodes: int,
                 stop: KillFn, workers: Callable[[], list[str]],
                 serving: Callable[[str], bool], requested: Callable[[], int]) -> None:
        super().__init__(record, t0)
        self.home, self.nodes, self.stop = home, nodes, stop
        self.workers, self.serving, self.requested = workers, serving, requested
        self.paces: list[tuple[str, float]] = []

    def _step(self, what: str, action: Callable[[], None]) -> None:
        began, before = time.monotonic(), self.requested()
        action()
        self.cancel.wait(ROLL_SETTLE_S)
        took = max(1e-3, time.monotonic() - began)
        self.paces.append((what, (self.requested() - before) / took))

    def inject(self) -> None:
        for node in range(1, self.nodes + 1):
            def bounce(node: int = node) -> None:
                kafka_local.stop_node(node, base_dir=self.home, hard=False)
                kafka_local.start_node(node, base_dir=self.home,
                                       timeout_s=BROKER_START_WAIT_S)
            self._step(f"broker {node}", bounce)
        for wid in sorted(self.workers()):
            def restart(wid: str = wid) -> None:
                self.stop(wid, ROLLING_RESTART)
                until = time.monotonic() + ROLL_WORKER_WAIT_S
                while not self.serving(wid) and time.monotonic() < until \
                        and not self.cancel.is_set():
                    self.cancel.wait(0.5)
            self._step(wid, restart)
        self.record.detail = "requests/s to the site per step: " + ", ".join(
            f"{what} {pace:.1f}" for what, pace in self.paces)


class StoreRestart(FaultThread):
    """Readers query the store in a loop (``crawlfleet sql``, as an operator watching a
    crawl does) while the store worker is killed and restarted by its supervisor."""

    def __init__(self, record: FaultRecord, t0: float, settings: Settings, kill: KillFn,
                 store_worker: str, readers_s: float = READERS_S) -> None:
        super().__init__(record, t0)
        self.s, self.kill, self.store_worker, self.readers_s = \
            settings, kill, store_worker, readers_s
        self.answered = 0
        self.failed: list[str] = []

    def inject(self) -> None:
        env = {**os.environ, **settings_env(self.s)}
        env.pop("CRAWLFLEET_CONFIG", None)
        self._read(env)  # the readers are under way before the kill
        self.kill(self.store_worker, STORE_RESTART)
        until = time.monotonic() + self.readers_s
        while time.monotonic() < until and not self.cancel.is_set():
            self._read(env)
            self.cancel.wait(0.5)
        first = f"; first failure: {self.failed[0][:160]}" if self.failed else ""
        self.record.detail = (f"readers: {self.answered} answered, {len(self.failed)} failed"
                              f"{first}")

    def _read(self, env: dict[str, str]) -> None:
        cmd = [sys.executable, "-m", "crawlfleet.cli", "sql", "--format", "tsv", READER_SQL]
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            self.failed.append("timed out after 60s")
            return
        if out.returncode == 0:
            self.answered += 1
        else:
            self.failed.append(" ".join(out.stderr.split())[-300:])


def state_dirs(settings: Settings, stage: str, worker: str) -> list[Path]:
    """A worker's local state directories: each store its stage declares, where the stage
    keeps it (:func:`streams.state_store.store_dir`)."""
    return [store_dir(settings, store, worker) for store in stage_spec(stage).store_names]


def wipe_state(settings: Settings, kill: KillFn, worker: str, stage: str,
               record: FaultRecord) -> None:
    """Kill ``worker``, delete its local state, and leave its restart to the supervisor:
    it must rebuild everything from the changelogs on the broker."""
    kill(worker, STATE_WIPE)
    dirs = state_dirs(settings, stage, worker)
    found = [d for d in dirs if d.exists()]
    if not found:
        record.error = f"no state directory at {', '.join(map(str, dirs))}"
        return
    sizes = []
    for d in found:
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        shutil.rmtree(d)
        sizes.append(f"{d.parent.parent.name}/ {size // 1024} KiB")
    record.detail = "wiped " + ", ".join(sizes)

