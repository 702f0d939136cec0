"""How long a stage's poll for input waits: short while it works, long once it is idle.

A poll returns as soon as a record arrives, so its timeout adds nothing to a hop; what it
bounds is how often the stage's loop wakes with nothing to do (to commit, fire timers,
resume partitions, write its status, see a stop). An idle fleet's workers woke 5 to 20
times a second each, and those wake-ups were most of their CPU (issue 43). Once a stage
has taken no record for ``IDLE_AFTER_S`` and holds nothing that is due by the clock
(parked jobs, paused partitions, timers, a restore), it polls for ``IDLE_POLL_S``: a stop
is then seen within that, and the first record ends the wait as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: A stage that took no record for this long is idle ...
IDLE_AFTER_S = 5.0
#: ... and polls this long (its stop is seen within it: a poll is not woken by a signal,
#: and a one-off crawl stops its long-idle stages, retry and revisit, at every end; at 1 s
#: that was ~0.5 s more on every crawl's teardown, for ~0.03 CPU-s/min a worker less).
IDLE_POLL_S = 0.5


class IdlePoll:
    """The timeout of a stage's next poll; ``took`` is called when a poll brought records."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()

    def took(self) -> None:
        self._last = self._clock()

    def timeout(self, working_s: float, holding: bool) -> float:
        """``working_s`` (the stage's own poll while it works) unless the stage is idle:
        nothing taken for ``IDLE_AFTER_S`` and nothing ``holding`` it to the clock."""
        if holding or self._clock() - self._last < IDLE_AFTER_S:
            return working_s
        return max(working_s, IDLE_POLL_S)
