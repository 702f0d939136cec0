"""Dashboard views and their Grafana form (pure: no engine)."""

from __future__ import annotations

import json

import pytest

from consumers.sampler import Sample, rates
from core.errors import ConfigError
from infra.views import (
    GRAFANA_JSON,
    bucket_for,
    expand,
    grafana_dashboard,
    load_views,
    parse_duration,
)


def test_every_view_has_a_title_and_a_time_window() -> None:
    views = load_views()
    assert {"queue_depth", "throughput", "oldest_task_age", "good_pages", "target_health",
            "dead_by_reason", "worker_success", "version_success"} <= set(views)
    for v in views.values():
        assert v.title != v.name and "$__timeFilter(" in v.sql, v.name


def test_macros_expand_to_a_window_ending_now() -> None:
    sql = "SELECT $__timeInterval(ts) AS t FROM x WHERE $__timeFilter(ts) AND a > $__fromTime"
    out = expand(sql, 3600, 60)
    assert "$__" not in out
    assert "toStartOfInterval(toDateTime(ts), INTERVAL 60 second)" in out
    assert "(ts >= (now64(3) - INTERVAL 3600 SECOND) AND ts <= now64(3))" in out
    assert bucket_for(3600) == 60 and bucket_for(600) == 10 and bucket_for(7 * 86400) == 21600


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900),
                                               ("6h", 21600), ("7d", 604800), ("1.5h", 5400)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0", "5y"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration(text)


def test_the_shipped_grafana_dashboard_is_built_from_the_views() -> None:
    """`python -m infra.views` rebuilds it; a view changed without a rebuild fails here."""
    assert json.loads(GRAFANA_JSON.read_text()) == grafana_dashboard(load_views())


def test_sampler_rates_are_per_second_since_the_previous_sample() -> None:
    now = 100.0
    first = [Sample("fetch", "t", lag=5, consumed=1000, behind=1, oldest_ms=None)]
    assert rates({}, first, now) == {("fetch", "t"): 0.0}  # nothing to compare with yet
    later = [Sample("fetch", "t", lag=0, consumed=1500, behind=0, oldest_ms=None)]
    assert rates({("fetch", "t"): (now, 1000)}, later, now + 10) == {("fetch", "t"): 50.0}
    # Offsets reset (a recreated topic): no negative rate.
    assert rates({("fetch", "t"): (now, 2000)}, later, now + 10) == {("fetch", "t"): 0.0}
