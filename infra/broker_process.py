"""The local brokers' processes: which pid is our broker, signals, and waiting for one to be
gone. Split from :mod:`infra.kafka_local` (the cluster's life cycle), which calls these."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from core.errors import InfraError
from infra.kafka_home import _MAIN_CLASS

_log = logging.getLogger("infra.kafka_local")


def is_our_broker(pid: int, props: Path, exec_wait_s: float = 0.5) -> bool:
    """True if pid is a live JVM running kafka.Kafka on this node's config (not a reused pid).

    A live process with an empty command line is between the two halves of an exec (the
    kernel has switched its memory but not yet set its arguments): a new node's launcher
    execs the JVM after its format, and reading it at that instant once made a starting
    node look dead. So an empty command line is read again for up to ``exec_wait_s``.
    """
    deadline = time.monotonic() + exec_wait_s
    while True:
        try:
            cmdline = _read_cmdline(pid)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in ("Z", "X"):
            return False
        if cmdline != [b""] or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    return _MAIN_CLASS.encode() in cmdline and str(props).encode() in cmdline


def _read_cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def send_signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def start_time(pid: int) -> str | None:
    """The process's start time (/proc stat field 22), or None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def wait_gone(pids: dict[int, Path], timeout_s: float) -> dict[int, Path]:
    """Poll until the processes exit; return those still alive at the deadline.

    The callers identified each pid as a broker; from then on a pid counts until /proc says it
    is gone or a zombie (same start time, so not a reused pid). Re-checking its command line
    would not do: an exiting process's cmdline reads empty while it still holds its ports and
    files, which let ``down`` return, and a restart find its port taken, before the JVM was gone.
    """
    deadline = time.monotonic() + timeout_s
    started = {pid: start_time(pid) for pid in pids}
    alive = {pid: props for pid, props in pids.items() if started[pid] is not None}
    while alive:
        alive = {pid: props for pid, props in alive.items() if start_time(pid) == started[pid]}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return alive


def terminate(pids: dict[int, Path], timeout_s: float) -> None:
    """SIGTERM (controlled shutdown), then SIGKILL whatever is still there at the deadline."""
    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    leftovers = wait_gone(pids, timeout_s)
    for pid in leftovers:
        _log.warning("Kafka pid %d ignored SIGTERM for %.0fs; killing it", pid, timeout_s)
        send_signal(pid, signal.SIGKILL)
    if wait_gone(leftovers, 10.0):
        raise InfraError(f"Kafka processes {sorted(leftovers)} survived SIGKILL")
