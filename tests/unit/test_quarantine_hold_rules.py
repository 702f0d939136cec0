"""What a quarantine holds, said as such, and when a one-off crawl ends it (pure logic)."""

from __future__ import annotations

from typing import Any

from consumers.fetch.quarantine_holds import describe, hold_of, summary
from crawlfleet.health import HELD_ONLY_LOOKS, only_quarantine_holds, quarantine_held
from streams.control import Quarantine

NOW = 1_800_000_000_000
T = "a.test"
QS = [Quarantine("profile", T, "beta", NOW + 60_000, "2 blocks (http_403)"),
      Quarantine("egress", T, "px2", NOW + 120_000, "2 blocks"),
      Quarantine("profile", "b.test", "beta", NOW + 999_000, ""),
      Quarantine("profile", T, "gamma", NOW - 1, "over")]


def test_a_held_job_is_blamed_on_the_quarantine_that_holds_it() -> None:
    assert hold_of(QS, T, "beta", NOW) == QS[0]  # its own profile's
    assert hold_of(QS, T, "alpha", NOW) == QS[1]  # none of its own: the one ending last
    assert hold_of(QS, T, "gamma", NOW) == QS[1]  # gamma's is over
    target = Quarantine("target", T, "", NOW + 5_000, "2 of 3 profiles")
    assert hold_of([*QS, target], T, "beta", NOW) == target  # the whole target first
    assert hold_of(QS, "c.test", "beta", NOW) is None


def test_the_dead_letter_names_the_quarantine_and_its_end() -> None:
    text = describe(QS[0], T)
    assert text.startswith("profile beta quarantined for a.test until 2027-01-15T08:01:00")
    assert "2 blocks (http_403)" in text
    assert "no identity left" in describe(None, T)


def test_the_note_says_how_many_and_until_when_per_target() -> None:
    got = summary({T: 4, "b.test": 1, "c.test": 0}, QS, NOW)
    assert got == {T: "4 jobs until 2027-01-15T08:02:00.000Z",
                   "b.test": "1 jobs until 2027-01-15T08:16:39.000Z"}


def _fetch(queued: int = 0, waiting: int = 0, held: int = 0, **g: int) -> dict[str, Any]:
    return {"stage": "fetch", "gauges": {"queued": queued, "identity_waiting": waiting,
                                         "quarantine_held": held, **g},
            "notes": {"quarantine_held": {T: f"{held} jobs"}} if held else {}}


def test_a_crawl_ends_held_jobs_only_when_they_are_all_it_waits_on() -> None:
    lags = {"fetch": 5, "parse": 0, "store": 0, "quarantine": 3}
    store = {"stage": "store", "gauges": {}}
    quiet = ("quarantine",)
    assert only_quarantine_holds([_fetch(1, 4, 5), store], lags, quiet)
    assert quarantine_held([_fetch(1, 4, 5), store]).jobs == 5
    assert not only_quarantine_holds([_fetch(2, 4, 5), store], lags, quiet)  # one not held
    assert not only_quarantine_holds([_fetch(0, 4, 4, inflight=1), store], lags, quiet)
    assert not only_quarantine_holds([_fetch(0, 4, 4)], {**lags, "parse": 1}, quiet)
    assert not only_quarantine_holds([_fetch(0, 4, 4), {"stage": "retry",
                                                         "gauges": {"timers": 1}}], lags, quiet)
    assert not only_quarantine_holds([_fetch()], lags, quiet)  # nothing held at all
    assert HELD_ONLY_LOOKS >= 2  # a job between two queues for one look is not "held"
