"""What each process of a crawl costs: CPU-seconds and peak PSS, by role.

A crawlfleet crawl is several processes (the ``crawl`` command, one per stage, the faust
quarantine app) plus a broker that outlives it; a figure for "the crawl" hides which of them
spends the machine. The benchmarks sample every process of the crawl's tree, and the broker,
while the crawl runs:

- CPU: ``utime + stime`` of ``/proc/PID/stat``, the last value sampled per process (a process
  that ends between two samples loses at most one interval of its CPU: the total is taken
  exactly from ``RUSAGE_CHILDREN`` by :class:`ChildCpu`, and the per-role figures say how it
  splits). The broker is counted from its value when the crawl started, so its start-up and
  earlier crawls are not in it.
- memory: the peak PSS of each process (shared pages split between the processes sharing
  them, so the per-role figures add up), summed per role, and what that peak is made of
  (:func:`pss_parts`: the chDB engine's library, other code, anonymous memory, mapped files),
  so "the store is big" can be told apart into "chDB's 530 MB library is paged in" and "it
  holds rows".

Roles come from the command line: ``worker STAGE`` is the stage, a JVM running
``kafka.Kafka`` is ``broker``, ``crawlfleet crawl`` is ``crawl``; anything else keeps its
command name.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def role_of(argv: list[str], comm: str = "") -> str:
    """The part a process plays in a crawl, from its command line."""
    if "worker" in argv and any("crawlfleet" in a for a in argv):
        i = argv.index("worker")
        if i + 1 < len(argv):
            return argv[i + 1]
    if "crawlfleet.worker_main" in argv:  # the crawl's lean start: STAGE follows the module
        i = argv.index("crawlfleet.worker_main")
        if i + 1 < len(argv):
            return argv[i + 1]
    if "kafka.Kafka" in argv:
        return "broker"
    if "crawl" in argv and any("crawlfleet" in a for a in argv):
        return "crawl"
    return comm or (Path(argv[0]).name if argv else "?")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU-seconds ``pid`` has used (None if it has gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    except (IndexError, ValueError):
        return None


def pss_bytes(pid: int) -> int:
    """PSS of ``pid`` (0 if gone). Costly: the kernel walks its page tables."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


#: What a process's PSS is made of, from each mapping's path in ``/proc/PID/smaps``.
PARTS = ("chdb", "code", "anon", "files")


def part_of(path: str) -> str:
    """Which of :data:`PARTS` a mapping's pages count as: the chDB engine's shared library
    (one file of ~530 MB, paged in by whatever the engine runs), other code (shared libraries,
    the interpreter), anonymous memory (heap, arenas, stacks: what a process allocates), or
    other mapped files (data files, RocksDB's, fonts, locale)."""
    name = path.rsplit("/", 1)[-1]
    if "_chdb" in name and ".so" in name:
        return "chdb"
    if not path or path.startswith(("[", "/memfd:", "/dev/zero")):
        return "anon"
    if ".so" in name or "python" in name or name == "java":
        return "code"
    return "files"


def pss_parts(pid: int) -> dict[str, int]:
    """PSS of ``pid`` in bytes by :data:`PARTS` (empty if gone). Costlier than
    :func:`pss_bytes`: the kernel writes a record per mapping."""
    parts = dict.fromkeys(PARTS, 0)
    part = "anon"
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        head = line.split(None, 5)
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):  # a mapping's header line
            part = part_of(head[5] if len(head) > 5 else "")
        elif head[0] == "Pss:":
            with contextlib.suppress(ValueError, IndexError):
                parts[part] += int(head[1]) * 1024
    return parts


def broker_pids() -> list[int]:
    """Every running Kafka broker JVM on this machine."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and "kafka.Kafka" in cmdline(int(entry)):
            out.append(int(entry))
    return out


@dataclass
class RoleCost:
    """One role's figures: CPU-seconds, the sum of its processes' peak PSS, processes."""

    cpu_s: float = 0.0
    peak_pss_mb: float = 0.0
    processes: int = 0
    pss_parts_mb: dict[str, float] = field(default_factory=dict)  # the peaks' make-up


#: A process's make-up is read again when its PSS exceeds the last read's by this factor
#: (reading ``smaps`` of a process that maps 500 MB takes a few ms).
PARTS_STEP = 1.03


@dataclass
class _Proc:
    role: str
    base_cpu: float  # CPU already used when first seen (only outside processes subtract it)
    cpu: float
    peak_pss: int = 0
    parts_at: int = 0  # the PSS when ``parts`` was read
    parts: dict[str, int] = field(default_factory=dict)


@dataclass
class ProcCosts:
    """Per-process CPU and peak PSS of a crawl's processes, sampled while it runs."""

    procs: dict[int, _Proc] = field(default_factory=dict)
    outside: set[int] = field(default_factory=set)  # counted from their first sample (broker)

    def watch_outside(self, pids: list[int]) -> None:
        """Processes that started before the crawl (a running broker)."""
        self.outside.update(pids)
        self.sample(pids, with_pss=False)

    def sample(self, pids: list[int], with_pss: bool) -> int:
        """Read each of ``pids``; the PSS they sum to now (0 unless ``with_pss``)."""
        total = 0
        for pid in pids:
            cpu = cpu_seconds(pid)
            if cpu is None:
                continue
            p = self.procs.get(pid)
            if p is None:
                argv = cmdline(pid)
                comm = ""
                with contextlib.suppress(OSError):
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                p = self.procs[pid] = _Proc(role_of(argv, comm),
                                            cpu if pid in self.outside else 0.0, cpu)
            p.cpu = cpu
            if with_pss:
                pss = pss_bytes(pid)
                total += pss
                p.peak_pss = max(p.peak_pss, pss)
                if pss > p.parts_at * PARTS_STEP:  # a new peak by a margin: read its make-up
                    parts = pss_parts(pid)
                    if parts:
                        p.parts, p.parts_at = parts, pss
        return total

    def by_role(self) -> dict[str, RoleCost]:
        out: dict[str, RoleCost] = {}
        for p in self.procs.values():
            r = out.setdefault(p.role, RoleCost())
            r.cpu_s += p.cpu - p.base_cpu
            r.peak_pss_mb += p.peak_pss / 2**20
            r.processes += 1
            for part, size in p.parts.items():
                r.pss_parts_mb[part] = r.pss_parts_mb.get(part, 0.0) + size / 2**20
        return out


class ChildCpu:
    """Exact CPU-seconds of the children this process reaps between start and stop
    (``RUSAGE_CHILDREN``: a reaped child's own waited-for descendants included; a daemon it
    did not wait for, such as a broker a crawl started, is not)."""

    def __init__(self) -> None:
        self._start = self._now()
        self.seconds = 0.0

    @staticmethod
    def _now() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    def stop(self) -> float:
        self.seconds = self._now() - self._start
        return self.seconds
