"""When a sink's input trickles, its batches linger: fewer, fuller writes at a polite rate.

A sink cuts a batch short when its input goes quiet (nothing new for ``quiet_s``): at full
speed that keeps results prompt, since a pause means the burst is over. At a polite rate
(a page every half second) every gap is "quiet", so each page became a batch of its own and
paid a batch's whole fixed cost -- a ClickHouse insert per table, an offset commit, a status
write -- alone: most of a polite fleet's CPU a page (issue 43). Once ``streak`` batches in a
row were small (fewer than ``small_rows`` records), the input is trickling: the next batch
ignores quiet gaps and gathers for ``linger_s`` after its first record (or until it is big).
The first batch that comes out big ends the trickle, so a burst is written as promptly as
before; a trickle's last page waits at most ``linger_s`` before it is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Trickle:
    """The batch-cut rule of a sink whose input may trickle (state: the recent batches)."""

    linger_s: float  # 0: never linger (every quiet gap cuts the batch)
    small_rows: int = 50
    streak: int = 3
    _small_in_a_row: int = field(default=0, init=False)

    @property
    def trickling(self) -> bool:
        """The input trickles: the next batch lingers."""
        return self.linger_s > 0 and self._small_in_a_row >= self.streak

    def wait_s(self, wait_s: float) -> float:
        """The longest a batch gathers after its first record (``wait_s``: the sink's)."""
        return max(wait_s, self.linger_s) if self.trickling else wait_s

    def cuts_on_quiet(self, rows: int) -> bool:
        """Whether a quiet gap ends a batch of ``rows`` records now."""
        return not self.trickling or rows >= self.small_rows

    def ended(self, rows: int) -> None:
        """A batch of ``rows`` records was cut (0: none came)."""
        if rows == 0:
            return  # an empty poll says nothing of the rate
        self._small_in_a_row = self._small_in_a_row + 1 if rows < self.small_rows else 0


__all__ = ["Trickle"]
