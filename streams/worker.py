"""A worker process's identity and life: its id (= transactional id), stop, and the wait
for its broker.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import (
    KafkaError,
    KafkaException,
)
from confluent_kafka.admin import AdminClient

from core.config import Settings
from infra import kafka_local
from streams.status import StatusFile

log = logging.getLogger("crawlfleet.runtime")


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


#: A worker that waits looks every ``QUICK_LOOK_S`` for its first ``QUICK_S`` (a crawl makes
#: its topics while its workers start; a local broker it started answers a few seconds
#: later), then backs off from ``WAIT_FIRST_S`` to ``WAIT_MAX_S``.
QUICK_LOOK_S, QUICK_S = 0.05, 10.0
#: A wait for topics is said (log, status) only once it has lasted ``TOPICS_QUIET_S``.
TOPICS_QUIET_S = 1.0


def wait_until(look: Callable[[], str | None], stop: StopFlag, status: StatusFile | None,
               what: str, *, gauge: str, subject: str, status_subject: str,
               quiet_s: float = 0.0) -> bool:
    """Call ``look`` (None once the condition holds, else why not) until it holds: True, or
    False if stopped.

    The one wait of a worker for what a moment cures (its broker, its topics): quick looks
    first, then back-off; once it has waited ``quiet_s`` it says so -- a log line now and
    every ``WAIT_LOG_EVERY_S``, the ``gauge`` at 1 and ``status_subject: reason`` as its
    status's ``waiting`` text -- and says when it is over.
    """
    began = time.monotonic()
    said_at: float | None = None
    delay = QUICK_LOOK_S
    while not stop.requested:
        reason = look()
        now = time.monotonic()
        if reason is None:
            if said_at is not None:
                log.info("%s: done waiting for %s after %.1f s", what, subject, now - began)
            if status is not None and status.waiting:
                status.waiting_for("", gauge)
            return True
        if now - began >= quiet_s:
            if said_at is None or now - said_at >= WAIT_LOG_EVERY_S:
                said_at = now
                log.warning("%s: waiting for %s (%.0f s so far): %s", what, subject,
                            now - began, reason)
            if status is not None:
                status.waiting_for(f"{status_subject}: {reason}", gauge, now - began)
        stop.wait(delay)
        if now - began >= QUICK_S:
            delay = min(WAIT_MAX_S, max(WAIT_FIRST_S, delay * 2))
    return False


def wait_for_topics(settings: Settings, names: list[str], stop: StopFlag,
                    status: StatusFile | None = None, what: str = "worker") -> bool:
    """Block until the cluster has every topic of ``names``: True, or False if stopped.

    A worker starts with its crawl, while the crawl makes its topics, or is deployed before
    ``crawlfleet topics create``: it joins its group only once its topics exist (a consumer
    subscribed to a topic that does not exist yet learns of it only at a later metadata
    refresh, its partitions unassigned meanwhile), and a long wait is said like the wait
    for Kafka (log, ``topics_waiting`` gauge, ``waiting`` text).
    """
    admin = AdminClient({**settings.kafka_common(), "log_level": 0})

    def missing() -> str | None:
        try:
            metadata = admin.list_topics(timeout=5.0).topics
        except KafkaException as exc:
            return str(exc.args[0].str())
        gone = sorted(n for n in names if n not in metadata or metadata[n].error is not None)
        if not gone:
            return None
        return (f"{len(gone)} topic(s) not created yet ({', '.join(gone[:3])}"
                f"{', ...' if len(gone) > 3 else ''}; `crawlfleet topics create` makes them)")

    return wait_until(missing, stop, status, what, gauge="topics_waiting",
                      subject="its topics", status_subject="topics", quiet_s=TOPICS_QUIET_S)


#: A session that failed waits this long before the next one joins (the rejoin is within
#: the session timeout, so static membership keeps the partitions).
REJOIN_PAUSE_S = 1.0


def kafka_answers(settings: Settings, timeout_s: float = 2.0) -> str | None:
    """None if a broker of ``settings`` answers a metadata request, else why not."""
    # Quiet: while the broker is down librdkafka would log every failed connect (several
    # a second); the waiting worker says so itself, once in a while.
    admin = AdminClient({**settings.kafka_common(), "log_level": 0,
                         # a broker that opens its port mid-wait is noticed within 0.1 s
                         # (librdkafka's reconnect back-off would grow to seconds)
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 100})
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
    found: list[Settings] = []
    where = kafka_target(settings)[1]

    def answers() -> str | None:
        target, _ = kafka_target(settings)
        reason = kafka_answers(target) if target is not None else "not running"
        if reason is None and target is not None:
            found.append(target)
        return reason

    if wait_until(answers, stop, status, what, gauge="kafka_waiting",
                  subject=f"Kafka at {where}", status_subject=f"Kafka at {where}"):
        return found[-1]
    return None
