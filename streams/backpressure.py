"""Bounded frontier: publishers and link discovery slow down when fetching falls behind.

The frontier's lag (records not yet committed by the fetch group) plus the jobs fetch
workers have parked on disk (their backlog reports in ``crawl.control``) is measured at most
once a second; records added since the last measurement count as lag too, so the bound
holds between measurements and overshoots by at most one page's links.
"""

from __future__ import annotations

import time

from core.config import Settings
from infra.lag import LagProbe
from infra.topics import topology_of
from schemas.codec import default_codec
from streams.control import ControlReader


class FrontierGate:
    """``known_lag``: the lag now, known without a measurement (a crawl's brand-new
    frontier holds 0): the first one then comes an interval later. Asking a freshly started
    broker for the fetch group's offsets waits for its group coordinator (a second or more
    while it loads or creates its offsets topic), and the crawl's seeds would wait for it.
    """

    def __init__(self, settings: Settings, probe_interval_s: float = 1.0,
                 known_lag: int | None = None) -> None:
        self.bound = settings.frontier_lag_bound
        topo = topology_of(settings)
        self._group = topo.group("fetch")
        self._topics = topo.inputs("fetch")
        self._partitions = topo.partitions
        self._interval = probe_interval_s
        self._probe = LagProbe(settings) if self.bound > 0 else None
        self._control = ControlReader(settings, topo.control, default_codec()) \
            if self.bound > 0 else None
        self._lag = known_lag or 0
        self._added = 0
        self._at = float("-inf") if known_lag is None else time.monotonic()

    @property
    def estimate(self) -> int:
        return self._lag + self._added

    def refresh(self, force: bool = False) -> None:
        """Measure the lag again (at most once per interval unless forced).

        Call it only when everything ``add``-ed so far has been produced: records still
        buffered (e.g. in an open transaction) are not in the measurement yet.
        """
        if self._probe is None:
            return
        now = time.monotonic()
        if force or now - self._at >= self._interval:
            lag = self._probe.lag(self._group, self._topics, self._partitions)
            if self._control is not None:
                self._control.poll(0)
                lag += self._control.state.parked if lag >= 0 else 0
            if lag >= 0:
                self._lag, self._added, self._at = lag, 0, now

    def due(self) -> bool:
        """True when :meth:`refresh` would measure again (a publisher flushes first)."""
        return self._probe is not None and time.monotonic() - self._at >= self._interval

    def over(self) -> bool:
        """True while the frontier holds at least ``bound`` records not yet fetched."""
        return self._probe is not None and self.estimate >= self.bound

    def add(self, n: int) -> None:
        self._added += n

    def wait(self, poll_s: float = 0.2) -> float:
        """Block while over the bound (publishers); returns seconds waited."""
        started = time.monotonic()
        while self.over():
            time.sleep(poll_s)
            self.refresh(force=True)
        return time.monotonic() - started

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
        if self._control is not None:
            self._control.close()
