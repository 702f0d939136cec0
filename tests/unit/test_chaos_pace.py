"""The chaos proof's pace arithmetic: kill phase, pages stored in it, retention, exposure."""

from __future__ import annotations

import pytest

from chaos.audit import requests_between
from chaos.drain import BrokerState
from chaos.exposure import Bound
from chaos.loss_check import StoreRows, check
from chaos.proof import paced_rate_cap
from chaos.report import (
    RETENTION_TARGET,
    ChaosReport,
    Phase,
    kill_window,
    pages_in_window,
    retention_of,
)
from chaos.round import RESTART_ALLOWANCE_S, exposure_window_s


def _phase(pages_per_s: float) -> Phase:
    return Phase(kills=5, start_s=8.0, end_s=40.0, pages=int(pages_per_s * 32),
                 pages_per_s=pages_per_s, crawl_pages_per_s=pages_per_s, drain_s=3.0,
                 drained=True, lost=0)


def _report(kill_rate: float | None, base_rate: float | None, *, lost: int = 0,
            extra_requests: int = 1, bound: int = 2) -> ChaosReport:
    """A report of 100 reachable pages, ``lost`` of them never stored, one URL requested
    ``1 + extra_requests`` times, judged against an over-apply bound of ``bound``."""
    urls = [f"http://h/{i}" for i in range(100)]
    stored = urls[lost:]
    requests = dict.fromkeys(stored, 1)
    requests[urls[-1]] += extra_requests
    verdict = check(dict.fromkeys(urls, 200), requests,
                    StoreRows(final=dict.fromkeys(stored, 1), raw=dict.fromkeys(stored, 1),
                              raw_keys=dict.fromkeys(stored, 1),
                              status=dict.fromkeys(stored, 200), dead={}))
    report = ChaosReport(
        pages=100, nodes=1, hosts=8, fetch_workers=2, parse_workers=2, kill_every_s=8.0,
        seed=1, rate_cap=2.0, topic_prefix="t.", session_timeout_s=30.0, verdict=verdict,
        committed_duplicates=0, parsed_records=100, robots_requests=8,
        bound=Bound(requests=bound, store_rows=0, legacy=0, gauge_missing=False, drops=1),
        kills=[], faults=[], restarts=3, broker=BrokerState(), seconds=60.0,
        crawl_seconds=50.0, drain_seconds=3.0, drained=True)
    report.kill_phase = _phase(kill_rate) if kill_rate is not None else None
    report.baseline = _phase(base_rate) if base_rate is not None else None
    return report


def test_kill_window_runs_first_kill_to_last() -> None:
    assert kill_window([30.0, 10.0, 20.0]) == (10.0, 30.0)


@pytest.mark.parametrize("walls", [[], [5.0], [5.0, 5.0]])
def test_no_kill_phase_without_two_distinct_kills(walls: list[float]) -> None:
    assert kill_window(walls) is None


def test_pages_in_window_counts_half_open_and_divides_by_length() -> None:
    stored = [0.5, 1.0, 1.5, 2.0, 2.9, 3.0, 4.0]
    assert pages_in_window(stored, 1.0, 3.0) == (4, 2.0)  # 1.0, 1.5, 2.0, 2.9; not 3.0


def test_pages_in_empty_or_reversed_window() -> None:
    assert pages_in_window([1.0, 2.0], 2.0, 2.0) == (0, 0.0)
    assert pages_in_window([1.0, 2.0], 3.0, 1.0) == (0, 0.0)


def test_retention_is_kill_rate_over_baseline_rate() -> None:
    assert retention_of(_phase(32.0), _phase(40.0)) == pytest.approx(0.8)


def test_no_retention_without_a_baseline_or_with_an_idle_one() -> None:
    assert retention_of(_phase(32.0), None) is None
    assert retention_of(None, _phase(40.0)) is None
    assert retention_of(_phase(32.0), _phase(0.0)) is None


def test_target_needs_correctness_bound_and_retention() -> None:
    assert _report(32.0, 40.0).meets_target  # exactly the target
    assert not _report(31.9, 40.0).meets_target
    assert not _report(40.0, 40.0, lost=1).meets_target
    assert not _report(40.0, 40.0, extra_requests=3).meets_target  # 3 beyond a bound of 2
    assert _report(40.0, 40.0, extra_requests=2).meets_target
    assert not _report(40.0, None).meets_target  # not measured is not met
    assert _report(32.0, 40.0).retention == pytest.approx(RETENTION_TARGET)


def test_exposure_window_follows_the_session_timeout() -> None:
    assert exposure_window_s(30_000) == 30.0 + RESTART_ALLOWANCE_S
    assert exposure_window_s(6_000) == 6.0 + RESTART_ALLOWANCE_S


def test_paced_rate_cap_spreads_pages_over_the_hosts() -> None:
    # 4800 pages on 8 hosts over max(60 s, 12 x 8 s = 96 s) → 6.25 req/s per host
    assert paced_rate_cap(4800, 8.0, hosts=8) == pytest.approx(6.25)
    assert paced_rate_cap(100, 8.0, hosts=20) == 2.0  # never below the floor


def test_requests_between_counts_a_half_open_window_of_the_site_log() -> None:
    timed = [(1.0, "a"), (2.0, "b"), (2.0, "c"), (3.5, "a"), (5.0, "d")]
    assert requests_between(timed, 2.0, 5.0) == 2  # (2, 5]: 3.5 and 5.0
    assert requests_between(timed, 0.0, 2.0) == 3
    assert requests_between(timed, 6.0, 9.0) == 0
    assert requests_between(timed, 5.0, 1.0) == 0  # a window the wrong way round
