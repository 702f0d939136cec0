"""Bounded frontier: publishers and link discovery slow down when fetching falls behind.

The frontier's lag (records not yet committed by the fetch group) plus the jobs fetch
workers have parked on disk (their backlog reports in ``crawl.control``) is measured at most
once a second; records added since the last measurement count as lag too, so the bound
holds between measurements and overshoots by at most one page's links.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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

    ``background``: measurements due run on a thread of the gate's own and are taken in by
    the next call once done, so a stage's loop never waits on one (a parse worker's read of
    the fetch group's offsets was caught blocking it 2.5 s, its pages waiting meanwhile).
    What was added while one ran still counts on top of it. A forced refresh (a publisher
    waiting for room) measures in place.
    """

    def __init__(self, settings: Settings, probe_interval_s: float = 1.0,
                 known_lag: int | None = None, background: bool = False) -> None:
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
        self._background = background and self._probe is not None
        #: A background measurement, and what was added before it began.
        self._running: tuple[_Measurement, int] | None = None

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
        if force and self._running is not None:
            self._running[0].done.wait()  # its clients are the probe's: one call at a time
        self._take_in()
        if not force and self.idle():
            return
        now = time.monotonic()
        if force or now - self._at >= self._interval:
            if self._background and not force:
                if self._running is None:
                    self._at = now  # the next one is due an interval after this one starts
                    self._running = (_Measurement(self._measure), self._added)
                return
            lag = self._measure()
            if lag >= 0:
                self._lag, self._added, self._at = lag, 0, now

    def idle(self) -> bool:
        """Nothing to learn from measuring: nothing was added since the last measurement
        and it was under the bound. A stage with nothing to do then asks the broker nothing
        (it asked twice a second, most of an idle parse worker's requests: issue 43); its
        first addition makes the next refresh measure, an interval after the last one
        at most, as before."""
        return (self._added == 0 and self._running is None and self._at > float("-inf")
                and 0 <= self._lag < self.bound)

    def _measure(self) -> int:
        """The frontier's lag plus the fetch workers' parked backlog (-1: unreadable)."""
        assert self._probe is not None
        lag = self._probe.lag(self._group, self._topics, self._partitions)
        if self._control is not None:
            self._control.poll(0)
            lag += self._control.state.parked if lag >= 0 else 0
        return lag

    def _take_in(self) -> None:
        """A background measurement that is done replaces the lag; what was added since
        it began stays on top."""
        if self._running is None or not self._running[0].done.is_set():
            return
        measurement, added_before = self._running
        self._running = None
        lag = measurement.lag  # -1 (unreadable): the estimate stands until the next one
        if lag >= 0:
            self._lag, self._added = lag, self._added - added_before

    def due(self) -> bool:
        """True when :meth:`refresh` would measure again (a publisher flushes first)."""
        return self._probe is not None and time.monotonic() - self._at >= self._interval

    def over(self) -> bool:
        """True while the frontier holds at least ``bound`` records not yet fetched."""
        self._take_in()
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
        """Close the gate's clients; one a background measurement still uses after
        ``CLOSE_WAIT_S`` is left to the process's exit (closing it under a call could crash
        it, and a stopping worker must not wait out a broker's timeout)."""
        if self._running is not None and not self._running[0].done.wait(CLOSE_WAIT_S):
            return
        if self._probe is not None:
            self._probe.close()
        if self._control is not None:
            self._control.close()


#: How long closing a gate waits for a background measurement still running.
CLOSE_WAIT_S = 0.5


class _Measurement:
    """One lag measurement on a daemon thread of its own (a process's exit never waits for
    it); ``lag`` once ``done`` is set, -1 if it failed."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self.done = threading.Event()
        self.lag = -1
        threading.Thread(target=self._run, args=(measure,), name="frontier-gate",
                         daemon=True).start()

    def _run(self, measure: Callable[[], int]) -> None:
        try:
            self.lag = measure()
        except Exception:  # the probe's client errors: unreadable, like a -1
            self.lag = -1
        finally:
            self.done.set()
