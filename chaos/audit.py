"""The measurements a round's audit takes besides the verdict: the store's readiness, the
kill phase's pace, and the site's request log on a clock.

The site's log stamps each request with this process's monotonic clock (the server runs in
it), which is how repeats are lined up with the faults before them and how the requests a
worker may have sent after its last status are counted (:mod:`chaos.exposure`).
"""

from __future__ import annotations

import bisect
import contextlib
import socket
import time

from chaos.report import Kill, Phase, kill_window, pages_in_window
from core.config import Settings
from core.errors import InfraError
from infra.clickhouse import PORT_FILE
from infra.store_query import run_query
from sites.demo_server import DemoSite
from sites.site_spec import canonical_url


def wait_for_store(settings: Settings, timeout_s: float = 60.0) -> None:
    """Wait until the store process serves queries, so reads never open chDB here."""
    port_file = settings.clickhouse_path / PORT_FILE
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            port = int(port_file.read_text())
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        time.sleep(0.5)
    raise InfraError(f"the store process did not serve queries within {timeout_s:g}s")


def timed_page_requests(site: DemoSite, port: int) -> list[tuple[float, str]]:
    """(monotonic time, canonical URL) of every page request, robots.txt left out."""
    _, log = site.snapshot()
    return [(t, canonical_url(f"http://{host}:{port}{raw}")) for t, host, raw in log
            if not raw.partition("?")[0].endswith("/robots.txt")]


def peak_host_rate(site: DemoSite, window_s: float = 1.0) -> tuple[str, int]:
    """(host, requests) of the host with the most requests in any ``window_s`` window, every
    request counted (robots.txt too: it takes the target's slot). Politeness promises at
    most cap + 1 in any 1-s window, however many workers run and whatever restarts."""
    _, log = site.snapshot()
    by_host: dict[str, list[float]] = {}
    for t, host, _raw in log:
        by_host.setdefault(host, []).append(t)
    worst = ("", 0)
    for host, times in by_host.items():
        times.sort()
        lo = 0
        for hi, t in enumerate(times):
            while t - times[lo] >= window_s:
                lo += 1
            if hi - lo + 1 > worst[1]:
                worst = (host, hi - lo + 1)
    return worst


def peak_window(site: DemoSite, host: str, window_s: float = 1.0) -> list[tuple[float, str]]:
    """(monotonic time, path) of every request of ``host``'s first busiest ``window_s``
    window: the evidence of a peak (which URLs, so which partition, and when)."""
    _, log = site.snapshot()
    times = sorted((t, raw) for t, h, raw in log if h == host)
    best: tuple[int, int] = (0, 0)
    lo = 0
    for hi in range(len(times)):
        while times[hi][0] - times[lo][0] >= window_s:
            lo += 1
        if hi - lo + 1 > best[1] - best[0]:
            best = (lo, hi + 1)
    return times[best[0]:best[1]]


def requests_between(timed: list[tuple[float, str]], start: float, end: float) -> int:
    """Requests in ``(start, end]`` (monotonic) of a time-ordered log."""
    times = [t for t, _ in timed]
    return max(0, bisect.bisect_right(times, end) - bisect.bisect_right(times, start))


def kill_phase(settings: Settings, kills: list[Kill], published_wall: float, drained: bool,
               drain_s: float, lost: int) -> Phase | None:
    """Stored pages/s from the first kill to the last, from the rows' own ``stored_at``
    (None below two kills)."""
    window = kill_window([k.wall for k in kills])
    if window is None:
        return None
    first_stored = [ms / 1000.0 for (ms,) in run_query(
        settings, "SELECT toUnixTimestamp64Milli(min(stored_at)) FROM pages GROUP BY url")[1]]
    n, rate = pages_in_window(first_stored, *window)
    last = max(first_stored, default=published_wall)
    span = last - published_wall
    return Phase(kills=len(kills), start_s=round(window[0] - published_wall, 2),
                 end_s=round(window[1] - published_wall, 2), pages=n,
                 pages_per_s=round(rate, 2),
                 crawl_pages_per_s=round(len(first_stored) / span, 2) if span > 0 else 0.0,
                 drain_s=round(drain_s, 1), drained=drained, lost=lost)
