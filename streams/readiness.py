"""Is a worker ready to take its share: joined its group, its state restored, consuming.

Readiness gates a rolling update: the next pod restarts once this one answers "ready", so
"the metrics page answers" is not enough -- a pod that has not rejoined its group, or whose
partitions still wait for their state, would let the update take the next pod down while
its own partitions stand still. The rule reads only the worker's own status (what its
status file holds), so the same answer comes from ``/ready`` on the metrics server, from
the status file, and from a test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Status gauges that mean "not restored yet": partitions paused for their state
#: (restoring includes a failing restore), and the quarantine app's table recovery.
NOT_RESTORED = ("restoring", "restore_failing", "recovering")


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  # why not, or what "ready" rests on

    @property
    def http_status(self) -> int:
        return 200 if self.ready else 503


def readiness(status: Mapping[str, Any]) -> Readiness:
    """The rule, on a status as the worker writes it (``StatusFile.snapshot()``).

    Not ready while it waits (for Kafka, its topics, its store, or refused: its version is
    not approved -- it then consumes nothing), before its first assignment (it has not
    joined), and while any assigned partition waits for its state. A member given no
    partition (more members than partitions) is ready: it has joined, and holds nothing.
    """
    waiting = str(status.get("waiting") or "")
    if waiting:
        return Readiness(False, f"waiting: {waiting}")
    gauges = status.get("gauges") or {}
    if gauges.get("refused"):
        return Readiness(False, "refused: its version tuple is not approved")
    if not status.get("rebalances"):
        return Readiness(False, "not joined its group yet")
    held = {g: int(gauges[g]) for g in NOT_RESTORED if gauges.get(g)}
    if held:
        return Readiness(False, "state not restored: " + ", ".join(
            f"{g} {n}" for g, n in sorted(held.items())))
    parts = len(status.get("assignment") or [])
    return Readiness(True, f"joined, restored, consuming {parts} partitions")
