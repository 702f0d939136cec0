"""Stopping a benchmarked crawler's whole process group, and reaping its leader.

A crawl that cannot drain (the skewed shape) or outlives its timeout is stopped from outside:
SIGTERM to its group, SIGKILL to whatever outlives the grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def end_group(pgid: int, reap: Callable[[float], bool], grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL it if anything outlives ``grace_s``; reap the
    leader (``reap(wait_s)`` is True once it is reaped)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap(0.1)
            if not _group_alive(pgid):
                break
        if not _group_alive(pgid):
            break
    reap(30.0)


def popen_reaper(proc: subprocess.Popen[bytes]) -> Callable[[float], bool]:
    def reap(wait_s: float) -> bool:
        try:
            proc.wait(timeout=wait_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    return reap


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in group ``pgid``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
