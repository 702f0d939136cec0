"""When a fetch worker hands its finished work on: the interval under load, at once when
the crawl waits on its results, and in growing bursts after a quiet spell."""

from __future__ import annotations

from consumers.fetch.stage import _STARVED_COMMIT_S, commit_due

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
