"""How often a calm crawl reads its changelogs again while they hold work: soon at first (a
transaction still committing is gone within a tick), less often while work stays parked."""

from __future__ import annotations

import itertools

from crawlfleet.health import HeldRecheck, HeldWork
from infra.live_state import LiveEntries

EMPTY = HeldWork(LiveEntries("crawl.parked"), LiveEntries("crawl.timers"))
OPEN_TXN = HeldWork(LiveEntries("crawl.parked", unsettled={0}), LiveEntries("crawl.timers"))


def _reads(recheck: HeldRecheck, held: HeldWork, ticks: list[float]) -> list[float]:
    """The ticks at which a read happens, the changelogs holding ``held`` each time."""
    found: HeldWork | None = None
    out = []
    for now in ticks:
        if recheck.due(now, found):
            recheck.reading(now, found)
            found = held
            out.append(now)
    return out


def test_held_work_is_read_again_soon_then_less_often() -> None:
    ticks = [round(0.1 * i, 1) for i in range(0, 80)]
    reads = _reads(HeldRecheck(0.25, 2.0), OPEN_TXN, ticks)
    assert reads[:2] == [0.0, 0.3]  # the first look again within a few ticks, not 2 s
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(reads)]
    # Backing off (0.25, 0.5, 1, 2 s, on 0.1 s ticks) to every 2 s.
    assert gaps[:3] == [0.3, 0.5, 1.0] and all(2.0 <= g <= 2.1 for g in gaps[3:]), gaps


def test_nothing_held_is_read_every_tick_and_a_busy_spell_starts_over() -> None:
    recheck = HeldRecheck(0.25, 2.0)
    assert _reads(recheck, EMPTY, [0.0, 0.1, 0.2]) == [0.0, 0.1, 0.2]
    _reads(recheck, OPEN_TXN, [1.0, 1.3, 1.9, 2.9])  # backed off meanwhile
    assert recheck.wait_s > 0.25
    recheck.reset()
    assert recheck.wait_s == 0.25 and recheck.due(3.0, OPEN_TXN)
