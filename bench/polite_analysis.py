"""The politeness benchmark's figures: what one crawl's request log says about its pace.

Pure analysis of the server's log (efficiency against the sum of caps, violations of the
cap plus the declared burst, per-host timing) and the targets they are judged by; no I/O.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from bench.peers import PeerResult
from sites.site_spec import SiteSpec, canonical_url

#: requests crawlfleet may send beyond the cap in any closed 1 s window (see module docstring)
DECLARED_BURST = 1
TARGET_EFFICIENCY = 0.95
#: pages/s from publication to the last page stored ÷ the sum of caps (issue 11, joins)
TARGET_PUBLISH_RATIO = 0.95

LogEntry = tuple[float, str, str]  # (monotonic time, host, raw path) as DemoSite logs it


@dataclass
class HostTiming:
    """One host's requests as the server saw them, timed from the crawler's first request."""

    host: str
    requests: int  # robots.txt included
    robots: int
    first_s: float
    last_s: float
    median_gap_s: float
    p99_gap_s: float
    max_gap_s: float
    max_in_window: int
    violations: int

    @property
    def active_rate(self) -> float:
        """Requests/s between this host's first and last request."""
        span = self.last_s - self.first_s
        return (self.requests - 1) / span if span > 0 else 0.0


@dataclass
class Politeness:
    name: str
    cap: float
    burst: int
    hosts_total: int
    expected: int
    reported_pages: int  # the crawler's own count (stored pages / parsed responses)
    fetched_expected: int  # distinct expected URLs the server was asked for
    page_requests: int
    robots_requests: int
    refetched: int  # page requests beyond the first for the same URL
    unexpected: int  # page requests for URLs outside the expected set (e.g. disallowed)
    window_s: float
    page_rate: float
    efficiency: float
    violations: int
    max_in_window: int
    hosts: list[HostTiming] = field(default_factory=list)
    per_second: list[int] = field(default_factory=list)  # all requests, 1 s bins from the first
    process_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    fetch_workers: int = 0  # crawlfleet's fetch workers (0: another crawler)
    publish_seconds: float = 0.0  # crawlfleet: seeds published → last page stored
    start_seconds: float = 0.0  # crawlfleet: workers started → last page stored
    first_request_s: float = 0.0  # crawlfleet: publication → the server's first request
    tail_s: float = 0.0  # crawlfleet: the server's last request → last page stored

    @property
    def sum_of_caps(self) -> float:
        return self.cap * self.hosts_total

    @property
    def publish_ratio(self) -> float | None:
        """Pages/s from publication to the last page stored ÷ the sum of caps."""
        return join_ratio(self.reported_pages, self.publish_seconds, self.sum_of_caps)

    @property
    def start_ratio(self) -> float | None:
        """The same from the workers' start (Scrapy: from its process start to its exit)."""
        seconds = self.start_seconds if self.fetch_workers else self.process_seconds
        return join_ratio(self.reported_pages, seconds, self.sum_of_caps)

    @property
    def limit(self) -> float:
        return self.cap + self.burst

    @property
    def exact(self) -> bool:
        return (
            self.fetched_expected == self.expected
            and self.refetched == 0
            and self.unexpected == 0
        )

    @property
    def meets_target(self) -> bool:
        return self.exact and self.violations == 0 and self.efficiency >= TARGET_EFFICIENCY

    @property
    def meets_join_target(self) -> bool:
        ratio = self.publish_ratio
        return ratio is not None and ratio >= TARGET_PUBLISH_RATIO


def join_ratio(pages: int, seconds: float, sum_of_caps: float) -> float | None:
    """``pages`` / ``seconds`` ÷ ``sum_of_caps``, or None when not timed."""
    if seconds <= 0 or sum_of_caps <= 0:
        return None
    return pages / seconds / sum_of_caps


def window_counts(times: Sequence[float], window: float = 1.0) -> list[int]:
    """For each request (sorted ``times``), how many requests fall in ``[t, t + window]``."""
    out: list[int] = []
    hi = 0
    for lo, t in enumerate(times):
        hi = max(hi, lo)
        while hi < len(times) and times[hi] - t <= window:
            hi += 1
        out.append(hi - lo)
    return out


def _is_robots(raw: str) -> bool:
    return raw.partition("?")[0] == "/robots.txt"


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def analyse(
    result: PeerResult,
    log: Sequence[LogEntry],
    spec: SiteSpec,
    expected: set[str],
    cap: float,
    burst: int = DECLARED_BURST,
) -> Politeness:
    """Politeness figures of one crawl from the server's request log."""
    entries = sorted(log)
    start = entries[0][0] if entries else 0.0
    end = entries[-1][0] if entries else 0.0
    window_s = end - start
    limit = cap + burst

    by_host: dict[str, list[LogEntry]] = defaultdict(list)
    for e in entries:
        by_host[e[1]].append(e)

    page_urls: list[str] = []
    robots_requests = 0
    for _, host, raw in entries:
        if _is_robots(raw):
            robots_requests += 1
        else:
            page_urls.append(canonical_url(spec.url(host, raw)))
    distinct = set(page_urls)

    hosts: list[HostTiming] = []
    for host in spec.hosts:
        items = by_host.get(host, [])
        times = [t for t, _, _ in items]
        counts = window_counts(times)
        gaps = [b - a for a, b in pairwise(times)]
        hosts.append(
            HostTiming(
                host=host,
                requests=len(items),
                robots=sum(1 for _, _, raw in items if _is_robots(raw)),
                first_s=times[0] - start if times else 0.0,
                last_s=times[-1] - start if times else 0.0,
                median_gap_s=statistics.median(gaps) if gaps else 0.0,
                p99_gap_s=_percentile(gaps, 0.99),
                max_gap_s=max(gaps, default=0.0),
                max_in_window=max(counts, default=0),
                violations=sum(1 for c in counts if c > limit),
            )
        )

    per_second = [0] * (int(window_s) + 1) if entries else []
    for t, _, _ in entries:
        per_second[int(t - start)] += 1

    page_rate = len(page_urls) / window_s if window_s > 0 else 0.0
    return Politeness(
        name=result.name,
        cap=cap,
        burst=burst,
        hosts_total=len(spec.hosts),
        expected=len(expected),
        reported_pages=result.pages,
        fetched_expected=len(distinct & expected),
        page_requests=len(page_urls),
        robots_requests=robots_requests,
        refetched=len(page_urls) - len(distinct),
        unexpected=len(distinct - expected),
        window_s=window_s,
        page_rate=page_rate,
        efficiency=page_rate / (cap * len(spec.hosts)),
        violations=sum(h.violations for h in hosts),
        max_in_window=max((h.max_in_window for h in hosts), default=0),
        hosts=hosts,
        per_second=per_second,
        process_seconds=result.process_seconds,
        peak_rss_mb=result.peak_rss_mb,
    )
