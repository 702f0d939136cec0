"""The doctor's pure checks: each finding from settings and measured fetch durations."""

from __future__ import annotations

from core.config import Settings
from crawlfleet import doctor
from crawlfleet.doctor import FAIL, NA, OK, WARN, Durations, checks
from streams.io import producer_conf

FAST = Durations(count=100, p50=0.01, p95=0.05, p99=0.1, max=0.2, window_s=3600)
SLOW = Durations(count=100, p50=4.0, p95=12.0, p99=18.0, max=20.0, window_s=3600)


def verdicts(s: Settings, d: Durations | None, txn_ms: int = 15_000,
             statuses: list[dict[str, object]] | None = None) -> dict[str, str]:
    return {c.name: c.verdict for c in checks(s, d, txn_ms, statuses)}


def test_defaults_are_healthy() -> None:
    fleet = [_live(st, 50) for st in ("fetch", "parse", "store", "retry")]
    v = verdicts(Settings(), FAST, statuses=fleet)
    assert set(v.values()) == {OK}, v
    assert not doctor.failed(checks(Settings(), FAST, 15_000, fleet))


LEASE = "max_poll_interval_ms >= 3x longest gap between polls"


def _live(stage: str, gap_ms: int) -> dict[str, object]:
    import os
    import time
    return {"stage": stage, "worker": f"{stage}-0", "pid": os.getpid(), "at": time.time(),
            "gauges": {"poll_gap_ms": gap_ms}}


def test_the_lease_is_checked_against_the_longest_gap_between_polls() -> None:
    fleet = [_live("fetch", 12), _live("parse", 400), _live("store", 2_500),
             _live("retry", 30)]
    (ok,) = [c for c in checks(Settings(), SLOW, 15_000, fleet) if c.name == LEASE]
    assert ok.verdict == OK and "store 2,500 ms" in ok.value  # 300 s >> 3 x 2.5 s
    tight = Settings(max_poll_interval_ms=6_000)
    results = checks(tight, FAST, 15_000, fleet)
    (bad,) = [c for c in results if c.name == LEASE]
    assert bad.verdict == FAIL and "7500" in bad.fix and doctor.failed(results)


def test_slow_fetches_no_longer_fail_the_lease() -> None:
    """A fetch runs beside the polls and the heartbeat thread keeps the session."""
    results = checks(Settings(), SLOW, 15_000, [_live("fetch", 15)])
    assert not doctor.failed(results), [c for c in results if c.verdict == FAIL]


def test_no_durations_leave_evidence_checks_open() -> None:
    v = verdicts(Settings(), None)
    assert v[LEASE] == NA  # no live worker measured
    assert v["rate caps reachable with max_inflight_per_target"] == NA
    assert FAIL not in v.values()


def test_seen_ttl_margin_uses_the_configs_horizon() -> None:
    s = Settings()
    horizon = s.dedupe_horizon_s
    assert doctor.seen_ttl_check(s).verdict == OK
    tight = Settings(seen_ttl_s=horizon * 1.05)
    assert doctor.seen_ttl_check(tight).verdict == WARN


TXN = "session/3 <= transaction timeout <= session_timeout_ms"


def test_transaction_timeout_longer_than_the_session_warns() -> None:
    assert verdicts(Settings(), FAST, txn_ms=31_000)[TXN] == WARN
    assert verdicts(Settings(), FAST, txn_ms=30_000)[TXN] == OK


def test_transaction_timeout_far_below_the_session_warns() -> None:
    """A broker pause past it aborts every batch: the former 15 s against a 60 s session."""
    assert verdicts(Settings(session_timeout_ms=60_000), FAST, txn_ms=15_000)[TXN] == WARN
    assert verdicts(Settings(session_timeout_ms=60_000), FAST, txn_ms=20_000)[TXN] == OK


def test_the_default_transaction_timeout_passes_its_own_check() -> None:
    for session in (10_000, 30_000, 90_000):
        s = Settings(session_timeout_ms=session)
        txn = int(producer_conf(s, "t", "t")["transaction.timeout.ms"])
        assert verdicts(s, FAST, txn_ms=txn)[TXN] == OK


def test_commit_interval_against_the_session() -> None:
    s = Settings(commit_interval_s=15.0)
    assert verdicts(s, FAST)["commit_interval_s < session_timeout_ms / 3"] == FAIL


def test_rate_caps_unreachable_with_the_in_flight_limit() -> None:
    s = Settings(rate_cap=2.0, rate_caps={"big.example": 5.0}, max_inflight_per_target=8)
    results = {c.name: c for c in checks(s, SLOW, 15_000)}
    assert results["rate_cap reachable with max_inflight_per_target"].verdict == WARN  # 24
    big = results["rate_caps[big.example] reachable with max_inflight_per_target"]
    assert big.verdict == WARN and "60" in big.fix
    fast = {c.name: c.verdict for c in checks(s, FAST, 15_000)}
    assert fast["rate_caps[big.example] reachable with max_inflight_per_target"] == OK


def test_other_misconfigurations() -> None:
    s = Settings(max_inflight=4, max_inflight_per_target=8, max_buffered=2,
                 connect_timeout_s=30.0, robots_ttl_s=5.0, frontier_lag_bound=1,
                 fleet_rate_cap=1.0, rate_cap=2.0)
    v = verdicts(s, FAST)
    for name in ("max_inflight >= max_inflight_per_target", "max_buffered >= max_inflight",
                 "connect_timeout_s < request_timeout_s", "robots_ttl_s >= 60",
                 "frontier_lag_bound >= max_buffered", "fleet_rate_cap >= rate_cap"):
        assert v[name] == WARN, (name, v)


def test_seen_topic_retention_against_the_ttl_and_the_horizon() -> None:
    s = Settings()
    week_ms = int(s.seen_ttl_s * 1000)
    assert doctor.seen_retention_check(s, week_ms).verdict == OK
    assert doctor.seen_retention_check(s, -1).verdict == OK
    assert doctor.seen_retention_check(s, None).verdict == NA
    shorter = doctor.seen_retention_check(s, week_ms // 2)
    assert shorter.verdict == WARN and f"retention.ms={week_ms}" in shorter.fix
    below = doctor.seen_retention_check(s, int(s.dedupe_horizon_s * 1000))
    assert below.verdict == FAIL
