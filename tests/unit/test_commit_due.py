"""When a fetch worker hands its finished work on: the interval under load, at once when
the crawl waits on its results, and in growing bursts after a quiet spell."""

from __future__ import annotations

import pytest

from consumers.fetch.stage import _STARVED_COMMIT_S, commit_due, poll_wait_s

INTERVAL = 1.0
NO_BURST = 10_000


def test_under_load_results_wait_for_the_interval() -> None:
    # Jobs still queued: the worker is busy, fewer and fuller transactions win.
    assert not commit_due(0.5, completed=40, queued=100, running=8, burst_cap=NO_BURST,
                          interval_s=INTERVAL)
    assert commit_due(1.0, completed=40, queued=100, running=8, burst_cap=NO_BURST,
                      interval_s=INTERVAL)


def test_a_starved_worker_hands_its_results_on_at_once_when_nothing_runs() -> None:
    assert commit_due(0.0, completed=1, queued=0, running=0, burst_cap=NO_BURST,
                      interval_s=INTERVAL)
    # Requests still in flight: every _STARVED_COMMIT_S, not on each loop.
    assert not commit_due(_STARVED_COMMIT_S / 2, completed=1, queued=0, running=3,
                          burst_cap=NO_BURST, interval_s=INTERVAL)
    assert commit_due(_STARVED_COMMIT_S, completed=1, queued=0, running=3,
                      burst_cap=NO_BURST, interval_s=INTERVAL)


def test_nothing_finished_is_never_starved() -> None:
    assert not commit_due(0.5, completed=0, queued=0, running=0, burst_cap=NO_BURST,
                          interval_s=INTERVAL)


def test_slow_start_commits_a_burst_before_the_interval() -> None:
    assert commit_due(0.01, completed=150, queued=100, running=8, burst_cap=150,
                      interval_s=INTERVAL)
    assert not commit_due(0.01, completed=149, queued=100, running=8, burst_cap=150,
                          interval_s=INTERVAL)


# --- how long the main loop's poll may wait ------------------------------------------------

NOW, IDLE = 100.0, 0.5


def test_a_request_in_flight_keeps_the_poll_short() -> None:
    assert poll_wait_s(NOW, running=1, completed=0, queued=50, next_due=NOW + 0.4,
                       commit_at=NOW + 0.5, idle_s=IDLE) == 0.01


def test_jobs_waiting_for_their_slot_wake_the_loop_when_the_next_may_start() -> None:
    # a polite crawl between two requests: no 100 Hz spin while the next slot is 0.5 s off
    assert poll_wait_s(NOW, running=0, completed=0, queued=50, next_due=NOW + 0.5,
                       commit_at=NOW, idle_s=IDLE) == 0.2
    assert poll_wait_s(NOW, running=0, completed=0, queued=50, next_due=NOW + 0.05,
                       commit_at=NOW, idle_s=IDLE) == pytest.approx(0.05)
    assert poll_wait_s(NOW, running=0, completed=0, queued=50, next_due=NOW - 1.0,
                       commit_at=NOW, idle_s=IDLE) == 0.01  # due already: look again soon


def test_finished_work_wakes_the_loop_when_its_commit_is_due() -> None:
    assert poll_wait_s(NOW, running=0, completed=3, queued=50, next_due=NOW + 0.5,
                       commit_at=NOW + 0.12, idle_s=IDLE) == pytest.approx(0.12)
    # starved (nothing queued): committed at once, as commit_due says
    assert poll_wait_s(NOW, running=0, completed=3, queued=0, next_due=None,
                       commit_at=NOW, idle_s=IDLE) == 0.01


def test_nothing_to_do_is_the_idle_wait() -> None:
    assert poll_wait_s(NOW, running=0, completed=0, queued=0, next_due=None,
                       commit_at=NOW, idle_s=IDLE) == IDLE
