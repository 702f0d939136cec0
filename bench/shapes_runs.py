"""The records of the shapes benchmark's runs (uncapped, skewed, start-up) and their medians.

Plain data the runners fill in and the reports read; the targets a run is judged by live
here beside the properties that apply them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.peers import PeerResult
from bench.proc_costs import RoleCost
from bench.shapes_referee import Referee

CRAWLERS = ("bare-aiohttp", "scrapy", "crawlfleet")
SKEWED = "skewed-polite"
TARGET_RATIO = 1.5  # small hosts' completion time / their bound


@dataclass
class ShapeRun:
    """One crawler's run on an uncapped shape: its own figures and the referee's."""

    shape: str
    crawler: str
    ref: Referee
    result: PeerResult | None
    error: str | None = None
    all_pages_per_s: list[float] = field(default_factory=list)
    every_run_exact: bool = True
    costs: dict[str, RoleCost] = field(default_factory=dict)  # crawlfleet: by process role
    summary: dict[str, Any] = field(default_factory=dict)  # crawlfleet: its summary JSON

    @property
    def cpu_ms_per_page(self) -> float | None:
        res = self.result
        return 1000 * res.cpu_s / res.pages if res is not None and res.pages else None

    @property
    def pages_per_s(self) -> float:
        return self.result.pages_per_s if self.result is not None else 0.0

    @property
    def exact(self) -> bool:
        return (
            self.result is not None
            and self.error is None
            and self.result.pages == self.ref.expected
            and self.ref.exact
        )

    @property
    def complete(self) -> bool:
        return self.exact and self.every_run_exact


def median_shape_run(runs: list[ShapeRun]) -> ShapeRun:
    ranked = sorted(runs, key=lambda r: r.pages_per_s)
    chosen = ranked[(len(ranked) - 1) // 2]
    chosen.all_pages_per_s = [r.pages_per_s for r in runs]
    chosen.every_run_exact = all(r.exact for r in runs)
    return chosen


@dataclass
class SkewedRun:
    """One crawler's run on the skewed shape, from the site's side."""

    crawler: str
    stopped: str  # "done", "timeout" or "exited (<code>)"
    completion_s: float | None  # its first request to the last small-host page answered
    bound_s: float  # max over small hosts of (expected pages + robots.txt) / cap
    small_served: int
    small_expected: int
    violations: int
    limited: int  # 429 answers
    big_requests: int  # big-host requests up to completion (or the stop)
    refetched: int
    disallowed: int
    first_request_s: float | None  # process start to the site's first request
    process_s: float
    peak_rss_mb: float

    @property
    def complete(self) -> bool:
        return self.completion_s is not None

    @property
    def ratio(self) -> float | None:
        return self.completion_s / self.bound_s if self.completion_s is not None else None

    @property
    def meets_target(self) -> bool:
        return (
            self.ratio is not None
            and self.ratio <= TARGET_RATIO
            and self.violations == 0
            and self.limited == 0
            and self.refetched == 0
            and self.disallowed == 0
        )


def median_skewed_run(runs: list[SkewedRun]) -> SkewedRun:
    ranked = sorted(runs, key=lambda r: r.completion_s if r.completion_s is not None else 1e18)
    return ranked[(len(ranked) - 1) // 2]


@dataclass
class FirstRequest:
    """``crawlfleet crawl``'s start-up on a small site, broker already running."""

    seconds: float | None  # process start to the site's first request
    process_s: float
    pages: int
    expected: int
    exit_code: int | None
