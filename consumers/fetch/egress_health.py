"""Egress health: which ways out are faulty themselves, pure logic, no clock of its own.

An egress (``direct`` or a forward proxy) is cooled off only for faults that are its own:
a connection that failed or timed out, a proxy that refused the tunnel or asked for
credentials (407). A block (403, 429 and the other block statuses) is one target's verdict
on one identity: it is counted in the quarantine's (target, profile) and (target, egress)
scopes, never here, so one site banning an exit cannot take that exit away from every
other site the worker crawls (a cascade). And since one site being down also looks like
timeouts and refused connections, the faults must come from more than one target:

    ``egress_failures`` faults within ``egress_window_s`` through one egress, on at least
    ``MIN_TARGETS`` (2) distinct targets, cool it off for ``egress_cooloff_s``.

With ``egress_failures = 1`` that still takes two faults (one per target). The state is
bounded by the faults inside one window: older ones are dropped as new ones arrive.
"""

from __future__ import annotations

from collections import OrderedDict, deque

#: Failure classes that are the egress's own fault (see :mod:`consumers.fetch.classify`).
EGRESS_FAULTS = frozenset({"connect", "timeout", "proxy", "http_407"})
#: Distinct targets an egress's faults must come from before it cools off.
MIN_TARGETS = 2


def egress_fault(reason: str) -> bool:
    """Whether an attempt that ended with ``reason`` says the egress itself is faulty."""
    return reason in EGRESS_FAULTS


class _Faults:
    """One egress's faults inside the window: their times (the newest ``failures``) and
    each target's latest one, oldest first."""

    __slots__ = ("by_target", "times")

    def __init__(self, failures: int) -> None:
        self.times: deque[float] = deque(maxlen=failures)
        self.by_target: OrderedDict[str, float] = OrderedDict()

    def add(self, target: str, now: float, window_s: float) -> None:
        self.times.append(now)
        self.by_target[target] = now
        self.by_target.move_to_end(target)
        cutoff = now - window_s
        while self.times and self.times[0] <= cutoff:
            self.times.popleft()
        while self.by_target and next(iter(self.by_target.values())) <= cutoff:
            self.by_target.popitem(last=False)


class EgressHealth:
    """Faults per egress over a sliding window; see the module's rule. A cool-off clears
    the egress's count (it starts again after)."""

    def __init__(self, failures: int, window_s: float, cooloff_s: float) -> None:
        self.failures, self.window_s, self.cooloff_s = failures, window_s, cooloff_s
        self._faults: dict[str, _Faults] = {}
        self._cool_until: dict[str, float] = {}

    def record(self, egress: str, target: str, now: float) -> bool:
        """One fault of ``egress`` seen on ``target``; True if the egress now cools off."""
        faults = self._faults.get(egress)
        if faults is None:
            faults = self._faults[egress] = _Faults(self.failures)
        faults.add(target, now, self.window_s)
        if len(faults.times) >= self.failures and len(faults.by_target) >= MIN_TARGETS:
            del self._faults[egress]
            self._cool_until[egress] = now + self.cooloff_s
            return True
        return False

    def cool_until(self, egress: str, now: float) -> float:
        """When ``egress``'s cool-off ends (0: none at ``now``)."""
        until = self._cool_until.get(egress, 0.0)
        if until and until <= now:
            del self._cool_until[egress]
            return 0.0
        return until

    def cooling(self, now: float) -> list[str]:
        return [e for e in list(self._cool_until) if self.cool_until(e, now)]
