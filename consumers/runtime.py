"""The small shared stage runtime: clients, transactional commit, rewind, status, stop.

Every stage is consume → transform → produce, and commits its outputs together with its
input offsets (sent with the consumer group metadata, KIP-447) in one Kafka transaction.
A stale owner's commit is rejected by the broker (producer epoch / group generation), so
no worker's local clock ever decides who owns a partition.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from consumers import faults
from consumers.metrics import GaugeFn, WorkerMetrics
from crawlfleet.config import Settings
from crawlfleet.errors import CrawlfleetError, KafkaStageError
from infra import kafka_local
from infra.kafka_io import Output, producer_conf, transaction_timeout_ms

log = logging.getLogger("crawlfleet.runtime")
R = TypeVar("R")


class FencedError(CrawlfleetError):
    """This worker no longer owns its transactional id or its partitions: drop and rejoin."""

    reason = "fenced"


class TxnAbortedError(KafkaStageError):
    """The transaction was aborted; the stage must rewind to its committed offsets."""

    reason = "txn_aborted"


def worker_name(stage: str, worker_id: str | None, slot_dir: Path | None = None) -> str:
    """The worker's id: the given one, else ``<host>-<stage>-<n>`` for the lowest free slot n.

    The id is the worker's transactional id and names its local state (the seen store), so a
    worker restarted without ``--worker-id`` should get its former id back -- fencing its old
    self at once and reopening its old store -- while two live workers must never share one.
    A slot is an flock on ``slot_dir/<stage>-<n>.lock``, released by the kernel when its
    holder dies. Without ``slot_dir`` the pid makes the id unique (not stable).
    """
    if worker_id:
        return worker_id
    host = socket.gethostname()
    if slot_dir is None:
        return f"{host}-{stage}-{os.getpid()}"
    slot_dir.mkdir(parents=True, exist_ok=True)
    for n in range(_MAX_SLOTS):
        fd = os.open(slot_dir / f"{stage}-{n}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        name = f"{host}-{stage}-{n}"
        _SLOTS[name] = fd  # held for the life of the process
        return name
    return f"{host}-{stage}-{os.getpid()}"


def release_worker_name(name: str) -> None:
    """Give a slot back before the process ends (tests; a process's exit does it anyway)."""
    fd = _SLOTS.pop(name, None)
    if fd is not None:
        os.close(fd)


_MAX_SLOTS = 256
_SLOTS: dict[str, int] = {}


class TxnCommitter:
    """Owns a transactional producer: outputs + input offsets commit atomically, or not at all.

    A commit gets one transaction timeout in all (its produce, offsets and commit calls
    retried within it), never more: it runs on the thread that polls the consumer, and a
    cluster that went down at once used to keep that thread in retries of 30-s calls for
    five minutes, until the consumer left its group for not polling. Past the budget the
    transaction's outcome is unknown; the session ends, and the next one's producer
    (``init_transactions`` under the same id) fences this one and settles it — committed
    or aborted, which the next session reads from the group's committed offsets.
    """

    def __init__(self, settings: Settings, transactional_id: str, client_id: str) -> None:
        self.transactional_id = transactional_id
        #: Seconds a whole commit (or the producer's start) may take.
        self.budget_s = transaction_timeout_ms(settings) / 1000
        self.clock: Callable[[], float] = time.monotonic
        self.sleep: Callable[[float], None] = time.sleep
        self.producer = Producer(producer_conf(settings, client_id, transactional_id))
        self._run("init_transactions", self.producer.init_transactions,
                  self.clock() + self.budget_s)

    def commit(self, consumer: Consumer, outputs: Iterable[Output],
               offsets: list[TopicPartition],
               track: frozenset[str] = frozenset()) -> dict[tuple[str, int], int]:
        """Produce ``outputs`` and commit ``offsets`` of ``consumer``'s group atomically.

        Returns the last offset written to each partition of the ``track`` topics (state
        changelogs), so a store can move its checkpoint past its own committed writes.
        """
        written: dict[tuple[str, int], int] = {}
        deadline = self.clock() + self.budget_s

        def delivered(err: KafkaError | None, msg: Any) -> None:
            offset = msg.offset()
            if err is None and offset is not None and offset >= 0:
                key = (msg.topic(), msg.partition())
                written[key] = max(written.get(key, -1), offset)

        self._run("begin_transaction", lambda _t: self.producer.begin_transaction(), deadline,
                  watch=False)
        try:
            for o in outputs:
                self._produce(o, delivered if o.topic in track else None, deadline)
            if offsets:
                meta = consumer.consumer_group_metadata()
                self._run("send_offsets_to_transaction",
                          lambda t: self.producer.send_offsets_to_transaction(offsets, meta, t),
                          deadline)
            faults.point("before_commit")
            if faults.fails("abort_commit"):
                raise TxnAbortedError("fault injection: the transaction must abort")
            self._run("commit_transaction", self.producer.commit_transaction, deadline)
            faults.point("after_commit")
        except TxnAbortedError:
            self._abort()
            raise
        # commit_transaction flushed every record and served their delivery reports.
        return written

    def _produce(self, o: Output, on_delivery: Callable[..., None] | None,
                 deadline: float) -> None:
        while True:
            try:
                if on_delivery is None:
                    self.producer.produce(o.topic, value=o.value, key=o.key,
                                          partition=o.partition, headers=o.headers)
                else:
                    self.producer.produce(o.topic, value=o.value, key=o.key,
                                          partition=o.partition, headers=o.headers,
                                          on_delivery=on_delivery)
                return
            except BufferError:
                if self.clock() >= deadline:
                    raise self._late("produce (the producer's queue stayed full)") from None
                self.producer.poll(0.05)  # queue full: let deliveries drain
            except KafkaException as exc:
                raise _classify(exc) from exc

    def _abort(self) -> None:
        try:
            self.producer.abort_transaction(self.budget_s)
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal():
                raise FencedError(f"abort failed fatally: {err}") from exc

    def _run(self, what: str, call: Callable[[float], Any], deadline: float,
             watch: bool = True) -> Any:
        """``call(timeout)`` until it succeeds, a non-retriable error, or ``deadline``;
        ``watch`` a call that asks a broker (a local one, begin_transaction, needs no
        watcher thread)."""
        attempt = 0
        while True:
            left = deadline - self.clock()
            if left <= 0:
                raise self._late(what)
            try:
                if not watch:
                    return call(left)
                with CallWatch(self.producer, f"{self.transactional_id}: {what}", left):
                    return call(left)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if not err.retriable() or err.txn_requires_abort():
                    raise _classify(exc) from exc
                attempt += 1
                log.info("%s: %s failed (%s), retrying", self.transactional_id, what, err.str())
                self.sleep(min(0.2 * attempt, 1.0, max(0.0, deadline - self.clock())))

    def _late(self, what: str) -> KafkaStageError:
        return KafkaStageError(
            f"{what} did not finish within the transaction timeout ({self.budget_s:.0f} s); "
            "the transaction's outcome is left to the next session's producer")

    def close(self) -> None:
        try:
            self.producer.flush(5)
        except KafkaException as exc:  # a fenced producer has nothing left worth flushing
            log.info("producer %s closed after: %s", self.transactional_id, exc)


class CallWatch:
    """Watches one transactional call that librdkafka may not return from in its timeout.

    ``send_offsets_to_transaction`` ignores its timeout while the group coordinator it
    cached sits on a broker librdkafka dropped (librdkafka#5456, #5511: after a whole-cluster
    restart). Past its timeout the watch says so and refreshes the producer's metadata (the
    refresh brings the brokers back, which wakes the coordinator lookup); a call still
    stuck after ``HANG_EXIT_S`` cannot be cancelled, and the worker leaves the process so
    its supervisor starts it again: its next producer fences this one and settles the
    transaction, and its partitions' work is redone from the committed offsets.
    """

    NUDGE_EVERY_S = 5.0
    HANG_EXIT_S = 120.0
    EXIT_CODE = 75  # EX_TEMPFAIL: start me again

    def __init__(self, producer: Producer, what: str, timeout_s: float) -> None:
        self.producer = producer
        self.what = what
        self.timeout_s = timeout_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="txn-call-watch")

    def __enter__(self) -> CallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _watch(self) -> None:
        began = time.monotonic()
        if self._done.wait(self.timeout_s + self.NUDGE_EVERY_S):
            return
        while not self._done.is_set():
            waited = time.monotonic() - began
            if waited >= self.HANG_EXIT_S:
                log.critical("%s has not returned after %.0f s (its timeout: %.0f s; "
                             "librdkafka#5456): the worker restarts", self.what, waited,
                             self.timeout_s)
                logging.shutdown()
                os._exit(self.EXIT_CODE)
            log.warning("%s has not returned after %.0f s (its timeout: %.0f s; "
                        "librdkafka#5456): refreshing metadata", self.what, waited,
                        self.timeout_s)
            with contextlib.suppress(KafkaException):
                self.producer.list_topics(timeout=self.NUDGE_EVERY_S)
            self._done.wait(self.NUDGE_EVERY_S)


def on_kafka_thread(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)``, with anything it raises turned into an exception.

    confluent-kafka can raise a bare ``KafkaError``, which is not an exception class (a
    rebalance callback served by ``close()`` did): it passes every ``except`` clause but a
    bare one, so a thread pool's worker thread died of it, the future it was running never
    completed, and the stage awaited it for ever while ignoring SIGTERM.
    """
    try:
        return fn(*args)
    except BaseException:
        raise
    except:  # noqa: E722 -- the one way to catch a raised non-exception object
        raise KafkaStageError(f"kafka client raised {sys.exc_info()[1]!r}") from None


def _classify(exc: KafkaException) -> CrawlfleetError:
    err: KafkaError = exc.args[0]
    if err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                     KafkaError.INVALID_PRODUCER_EPOCH):
        return FencedError(f"transaction fenced: {err.str()}")
    if err.txn_requires_abort():
        return TxnAbortedError(f"transaction must abort: {err.str()}")
    return KafkaStageError(f"kafka error: {err.str()}")


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


class StopFlag:
    """Set by SIGTERM/SIGINT so loops finish their current step and leave the group cleanly."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self._event.set())
            signal.signal(signal.SIGINT, lambda *_: self._event.set())
        return self

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``, cut short by a stop request (then True)."""
        return self._event.wait(timeout_s)

    @property
    def requested(self) -> bool:
        return self._event.is_set()


#: Back-off of a worker waiting for something a moment cures (its broker, its store).
WAIT_FIRST_S, WAIT_MAX_S = 0.2, 5.0
#: A worker that keeps waiting says so again this often (the first time at once).
WAIT_LOG_EVERY_S = 30.0


def kafka_target(settings: Settings) -> tuple[Settings | None, str]:
    """(settings with the bootstrap servers to use, or None if there are none yet; where
    that is, for a person): the configured cluster, else the local one if it runs."""
    if settings.bootstrap_servers:
        return settings, settings.bootstrap_servers
    st = kafka_local.status()
    if st.running:
        return settings.replace(bootstrap_servers=st.bootstrap_servers), st.bootstrap_servers
    if st.bootstrap_servers:
        return None, f"{st.bootstrap_servers} (the local broker: `crawlfleet kafka up`)"
    return None, ("no Kafka configured (--bootstrap, CRAWLFLEET_BOOTSTRAP_SERVERS) and no "
                  "local broker (`crawlfleet kafka up`)")


def kafka_answers(settings: Settings, timeout_s: float = 2.0) -> str | None:
    """None if a broker of ``settings`` answers a metadata request, else why not."""
    # Quiet: while the broker is down librdkafka would log every failed connect (several
    # a second); the waiting worker says so itself, once in a while.
    admin = AdminClient({**settings.kafka_common(), "log_level": 0})
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        err: KafkaError = exc.args[0]
        return err.str()
    return None


def wait_for_kafka(settings: Settings, stop: StopFlag, status: StatusFile | None = None,
                   what: str = "worker") -> Settings | None:
    """Block until the crawl's Kafka answers; the settings to use, or None if stopped.

    A broker that is not up yet (restarting, started after the workers) is a condition a
    moment cures: the worker retries with back-off and says "waiting for Kafka at X" (log,
    and the ``kafka_waiting`` gauge and ``waiting`` text of its status), never exits.
    """
    began = time.monotonic()
    said_at: float | None = None
    delay = WAIT_FIRST_S
    while not stop.requested:
        target, where = kafka_target(settings)
        reason = kafka_answers(target) if target is not None else "not running"
        if reason is None and target is not None:
            if said_at is not None:
                log.info("%s: Kafka at %s answers after %.1f s of waiting", what, where,
                         time.monotonic() - began)
            if status is not None:
                status.waiting_for("", "kafka_waiting")
            return target
        now = time.monotonic()
        if said_at is None or now - said_at >= WAIT_LOG_EVERY_S:
            said_at = now
            log.warning("%s: waiting for Kafka at %s (%.0f s so far): %s", what, where,
                        now - began, reason)
        if status is not None:
            status.waiting_for(f"Kafka at {where}: {reason}", "kafka_waiting", now - began)
        stop.wait(delay)
        delay = min(WAIT_MAX_S, delay * 2)
    return None


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
        self._last_write = 0.0
        self._last_activity = time.monotonic()

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
        now = time.monotonic()
        if not force and now - self._last_write < 0.5:
            return
        self._last_write = now
        for name, fn in self.gauge_fns.items():
            self.gauges[name] = fn()
        data = {"stage": self.stage, "worker": self.worker, "pid": os.getpid(),
                "host": _HOST, "counters": self.counters, "gauges": self.gauges,
                "idle_s": round(now - self._last_activity, 3), "wall": time.time(),
                "metrics_port": self.metrics.port, "waiting": self.waiting,
                "assignment": [list(tp) for tp in self.assignment],
                "rebalances": self.rebalances}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)

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
