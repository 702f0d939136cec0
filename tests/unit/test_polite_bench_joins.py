"""The politeness benchmark's join figures: worker-count lists and pace ratios."""

from __future__ import annotations

import pytest

from bench.polite_analysis import Politeness, join_ratio
from bench.polite_bench import parse_counts


def _run(pages: int, publish_s: float, start_s: float, workers: int = 2,
         process_s: float = 0.0) -> Politeness:
    return Politeness(name="crawlfleet", cap=5.0, burst=1, hosts_total=10, expected=pages,
                      reported_pages=pages, fetched_expected=pages, page_requests=pages,
                      robots_requests=10, refetched=0, unexpected=0, window_s=40.0,
                      page_rate=pages / 40.0, efficiency=0.99, violations=0,
                      max_in_window=5, process_seconds=process_s, fetch_workers=workers,
                      publish_seconds=publish_s, start_seconds=start_s)


def test_parse_counts_keeps_order_and_drops_repeats() -> None:
    assert parse_counts("1,2,4") == [1, 2, 4]
    assert parse_counts(" 4, 1 ,4,") == [4, 1]
    assert parse_counts("3") == [3]


@pytest.mark.parametrize("text", ["", "0", "1,-2", "two"])
def test_parse_counts_refuses_bad_lists(text: str) -> None:
    with pytest.raises(ValueError):
        parse_counts(text)


def test_join_ratio_is_pages_per_second_over_the_sum_of_caps() -> None:
    assert join_ratio(2000, 50.0, 50.0) == pytest.approx(0.8)
    assert join_ratio(2000, 0.0, 50.0) is None


def test_publish_and_start_ratios_and_target() -> None:
    run = _run(2000, publish_s=41.0, start_s=48.0)  # ideal: 2000 / (10 x 5) = 40 s
    assert run.publish_ratio == pytest.approx(40 / 41)
    assert run.start_ratio == pytest.approx(40 / 48)
    assert run.meets_join_target  # 0.976 >= 0.95
    assert not _run(2000, publish_s=43.0, start_s=50.0).meets_join_target  # 0.930


def test_a_peer_is_timed_from_its_process_start() -> None:
    peer = _run(2000, publish_s=0.0, start_s=0.0, workers=0, process_s=50.0)
    assert peer.publish_ratio is None and not peer.meets_join_target
    assert peer.start_ratio == pytest.approx(0.8)
