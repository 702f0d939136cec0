"""When each step of a crawl was reached, counted from the command's own start."""

from __future__ import annotations

import os
import time


def process_age_s() -> float:
    """Seconds since this process was started (Linux ``/proc``; 0.0 where unknown), so a
    crawl's phases count from the command's start, interpreter and imports included."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class Phases:
    """When each step of a crawl was reached, in seconds from the command's start."""

    def __init__(self) -> None:
        self.origin = time.monotonic() - process_age_s()
        self.marks: dict[str, float] = {}

    def mark(self, name: str, at: float | None = None) -> None:
        """Step ``name`` reached now (or at monotonic time ``at``)."""
        self.marks[name] = round((time.monotonic() if at is None else at) - self.origin, 3)

    def mark_wall(self, name: str, unix_s: float) -> None:
        """Step ``name`` reached at Unix time ``unix_s`` (read from the store)."""
        self.mark(name, time.monotonic() - (time.time() - unix_s))
