"""The fleet-wide aggregate cap, split among the live fetch members: pure logic.

Each member paces its own dispatches at its share of ``fleet_cap``: the fraction of the
frontier partitions it owns (``1 / members`` when the assignment is unknown), as the
broker reports the group after every rebalance. The shares sum to one, so the fleet as a
whole never exceeds ``fleet_cap`` (plus one request per member while a rebalance is being
learnt), and a member that owns more targets gets more of the budget.
"""

from __future__ import annotations


class Pacer:
    """Strict spacing of this member's requests (no cap when ``fleet_cap`` is 0)."""

    def __init__(self, fleet_cap: float, members: int = 1) -> None:
        self.fleet_cap = fleet_cap
        self.members = max(1, members)
        self.share = 1.0 / self.members
        self._next_at = 0.0

    @property
    def interval(self) -> float:
        return 1.0 / (self.fleet_cap * self.share) if self.fleet_cap > 0 else 0.0

    def set_members(self, members: int, mine: int = 0, total: int = 0) -> None:
        """Membership and, when known, this member's partitions out of all assigned."""
        self.members = max(1, members)
        self.share = mine / total if total > 0 and mine > 0 else 1.0 / self.members

    def available(self, now: float, want: int) -> int:
        """How many of ``want`` dispatches may start now (at most one when capped)."""
        if self.fleet_cap <= 0:
            return want
        return min(want, 1) if self._next_at <= now else 0

    def take(self, now: float, n: int) -> None:
        """Count ``n`` dispatches started at ``now``."""
        if self.fleet_cap > 0 and n > 0:
            self._next_at = max(self._next_at, now) + n * self.interval

    def next_at(self) -> float | None:
        return self._next_at if self.fleet_cap > 0 else None
