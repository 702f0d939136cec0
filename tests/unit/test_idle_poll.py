"""A stage polls long only once it is idle and holds nothing the clock is due to release
(issue 43: an idle fleet's loops woke 5-20 times a second each)."""

from __future__ import annotations

from streams.idle_poll import IDLE_AFTER_S, IDLE_POLL_S, IdlePoll


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_poll_grows_only_after_a_quiet_spell_and_shrinks_at_the_first_record() -> None:
    clock = _Clock()
    idle = IdlePoll(clock)
    assert idle.timeout(0.2, holding=False) == 0.2  # just started: as busy
    clock.t += IDLE_AFTER_S - 0.1
    assert idle.timeout(0.2, holding=False) == 0.2
    clock.t += 0.2
    assert idle.timeout(0.2, holding=False) == IDLE_POLL_S
    assert idle.timeout(0.05, holding=False) == IDLE_POLL_S  # the store's short poll too
    idle.took()
    assert idle.timeout(0.2, holding=False) == 0.2


def test_work_held_to_the_clock_keeps_the_short_poll() -> None:
    clock = _Clock()
    idle = IdlePoll(clock)
    clock.t += 10 * IDLE_AFTER_S
    assert idle.timeout(0.2, holding=True) == 0.2  # timers, parked jobs, paused partitions
    assert idle.timeout(2.0, holding=False) == 2.0  # never shorter than the stage's own
