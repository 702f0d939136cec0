"""Worker metrics: off by default, served on loopback, status counters and gauges exposed."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.config import load_settings
from core.errors import ConfigError
from streams.metrics import WorkerMetrics, status_class
from streams.status import StatusFile


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_status_class() -> None:
    assert [status_class(s) for s in (0, 200, 302, 404, 503, 42)] == \
        ["none", "2xx", "3xx", "4xx", "5xx", "none"]


def test_off_by_default_records_nothing(tmp_path: Path) -> None:
    status = StatusFile(tmp_path, "fetch", "w1")
    assert load_settings().metrics_port == -1
    status.metrics.request("ok", 200, 0.01)  # no server, no registry: a no-op
    status.metrics.dead_letter("http_500")
    status.write(force=True)
    assert '"metrics_port": null' in status.path.read_text()


def test_settings_validate_port_and_bind() -> None:
    with pytest.raises(ConfigError, match="metrics_port"):
        load_settings(metrics_port=70000)
    with pytest.raises(ConfigError, match="metrics_bind"):
        load_settings(metrics_bind=" ")


def test_served_metrics(tmp_path: Path) -> None:
    s = load_settings(metrics_port=0, code_revision="abc123")
    status = StatusFile(tmp_path, "fetch", "w1")
    port = status.metrics.serve(s, status)
    try:
        assert port > 0
        for outcome, code in (("ok", 200), ("ok", 200), ("ok", 404), ("retry", 503),
                              ("dead", 0)):
            status.metrics.request(outcome, code, 0.02)
        status.metrics.dead_letter("timeout")
        status.metrics.restored(0.3)
        status.add("committed_txns", 3)
        status.add("aborted_txns")
        status.add("assigned_partitions", 4)
        status.add("consumed", 7)
        status.gauges.update(inflight=2, queued=5, uncommitted=4, active_quarantines=3)
        status.add("held_for_commit")
        status.add("quarantines_profile", 2)  # the quarantine app's counters
        status.add("quarantines_egress")
        status.add("second_order")
        status.gauge_fns["deferred_targets"] = lambda: 1
        status.write(force=True)
        m = _scrape(port)
    finally:
        status.remove()

    def value(name: str, **labels: str) -> float:
        return sum(v for lb, v in m.get(name, []) if labels.items() <= lb.items())

    base = {"stage": "fetch", "worker": "w1"}
    assert value("crawlfleet_fetch_requests_total", outcome="ok", status_class="2xx",
                 code_revision="abc123", **base) == 2
    assert value("crawlfleet_fetch_requests_total", status_class="4xx") == 1
    assert value("crawlfleet_fetch_requests_total", outcome="dead", status_class="none") == 1
    assert value("crawlfleet_fetch_request_duration_seconds_count") == 5
    assert value("crawlfleet_dead_letters_total", reason="timeout", **base) == 1
    assert value("crawlfleet_restore_duration_seconds_count") == 1
    assert value("crawlfleet_transactions_total", result="committed") == 3
    assert value("crawlfleet_transactions_total", result="aborted") == 1
    assert value("crawlfleet_rebalance_partitions_total", change="assigned") == 4
    assert value("crawlfleet_worker_events_total", event="consumed") == 7
    assert value("crawlfleet_inflight_requests", **base) == 2
    assert value("crawlfleet_queued_jobs") == 5
    assert value("crawlfleet_uncommitted_results", **base) == 4  # the over-apply exposure
    assert value("crawlfleet_deferred_targets") == 1
    assert value("crawlfleet_fetch_held_for_commit_total") == 1
    assert value("crawlfleet_quarantines_total", scope="profile") == 2
    assert value("crawlfleet_quarantines_total", scope="egress") == 1
    assert value("crawlfleet_quarantines_second_order_total") == 1
    assert value("crawlfleet_active_quarantines") == 3
    info = m["crawlfleet_build_info"][0][0]
    assert info["code_revision"] == "abc123" and info["fetcher_version"].startswith("crawlfleet")
    assert not status.metrics.on  # remove() stopped the server


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    first = WorkerMetrics("fetch", "a")
    status = StatusFile(tmp_path, "fetch", "a")
    port = first.serve(load_settings(metrics_port=0), status)
    try:
        with pytest.raises(ConfigError, match="cannot serve metrics"):
            WorkerMetrics("fetch", "b").serve(load_settings(metrics_port=port), status)
    finally:
        first.close()
