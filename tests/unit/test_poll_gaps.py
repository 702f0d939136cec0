"""The longest gap between two polls, as the ``poll_gap_ms`` gauge reports it (fake clock)."""

from __future__ import annotations

from pathlib import Path

from streams.status import PollGaps, StatusFile


def test_the_gauge_is_the_longest_gap_of_the_last_window_or_two(tmp_path: Path) -> None:
    now = [0.0]
    status = StatusFile(tmp_path, "store", "store-0")
    gaps = PollGaps(status, window_s=100.0, clock=lambda: now[0])

    def polls_until(end: float, every: float = 0.5) -> None:
        while now[0] < end:
            now[0] += every
            gaps.tick()

    polls_until(10.0)
    now[0] += 2.5  # one 2.5-s batch between two polls
    gaps.tick()
    polls_until(20.0)
    assert status.gauges["poll_gap_ms"] == 2500
    polls_until(150.0)  # a new window: the last one's longest still counts
    assert status.gauges["poll_gap_ms"] == 2500
    polls_until(250.0)  # two windows on: forgotten
    assert status.gauges["poll_gap_ms"] == 500
