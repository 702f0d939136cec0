"""The chaos proof's pace arithmetic: kill phase, pages stored in it, retention, exposure."""

from __future__ import annotations

import pytest

from crawlfleet.chaos import (
    RESTART_ALLOWANCE_S,
    RETENTION_TARGET,
    ChaosReport,
    Phase,
    exposure_window_s,
    kill_window,
    paced_rate_cap,
    pages_in_window,
    retention_of,
)


def _phase(pages_per_s: float) -> Phase:
    return Phase(kills=5, start_s=8.0, end_s=40.0, pages=int(pages_per_s * 32),
                 pages_per_s=pages_per_s, crawl_pages_per_s=pages_per_s, drain_s=3.0,
                 drained=True, lost=0)


def _report(kill_rate: float | None, base_rate: float | None, **kw: object) -> ChaosReport:
    fields: dict[str, object] = dict(
        pages=100, nodes=1, fetch_workers=2, parse_workers=2, kill_every_s=8.0, seed=1,
        rate_cap=2.0, topic_prefix="t.", pages_expected=100, pages_stored=100,
        distinct_urls=100, raw_rows=100, dead_lettered=0, dead_by_reason={}, lost=0,
        lost_sample=[], unexpected_pages=0, wrong_status=0, final_duplicates=0,
        committed_duplicates=0, parsed_records=100, stored_duplicates=0, page_requests=101,
        distinct_requested=100, robots_requests=1, over_apply_ratio=1.01,
        inflight_at_kills=1, fetch_exposure=2, over_apply_bound=1.02, kills=[],
        broker_kills=[], restarts=3, seconds=60.0, crawl_seconds=50.0, drain_seconds=3.0,
        drained=True)
    fields.update(kw)
    report = ChaosReport(**fields)  # type: ignore[arg-type]
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
    assert not _report(40.0, 40.0, over_apply_ratio=1.05).meets_target
    assert not _report(40.0, None).meets_target  # not measured is not met
    assert _report(32.0, 40.0).retention == pytest.approx(RETENTION_TARGET)


def test_exposure_window_follows_the_session_timeout() -> None:
    assert exposure_window_s(30_000) == 30.0 + RESTART_ALLOWANCE_S
    assert exposure_window_s(6_000) == 6.0 + RESTART_ALLOWANCE_S


def test_paced_rate_cap_spreads_pages_over_the_hosts() -> None:
    # 4800 pages on 8 hosts over max(60 s, 12 x 8 s = 96 s) → 6.25 req/s per host
    assert paced_rate_cap(4800, 8.0, hosts=8) == pytest.approx(6.25)
    assert paced_rate_cap(100, 8.0, hosts=20) == 2.0  # never below the floor
