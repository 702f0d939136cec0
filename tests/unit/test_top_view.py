"""crawlfleet top's pure parts: the trend line and the rendering of a snapshot."""

from __future__ import annotations

import re

from rich.console import Console

from crawlfleet.top import Snapshot, StageView, render, sparkline


def test_sparkline_scales_to_the_largest_value() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 0, 0]) == "▁▁▁"
    assert sparkline([0, 4, 8]) == "▁▅█"


def test_a_snapshot_renders_every_part_even_without_the_store() -> None:
    snap = Snapshot(at=0.0, stages={"fetch": StageView(12, 3.5, ["fetch-0"], [1, 12])},
                    paused=True, paused_targets=["a.test"], caps={"b.test": 0.5},
                    notes=["store unavailable: no crawl store"])
    console = Console(width=200, record=True)
    console.print(render(snap))
    text = console.export_text()
    assert "fleet PAUSED" in text
    assert "fetch" in text and "12" in text and "1: fetch-0" in text
    assert "parse" in text and "?" in text  # a stage without figures says so
    assert "paused targets: a.test" in text and "b.test=0.5/s" in text
    assert "note: store unavailable" in text


def _text(snap: Snapshot) -> str:
    console = Console(width=200, record=True)
    console.print(render(snap))
    return console.export_text()


def _idle(members: dict[str, list[str]]) -> Snapshot:
    return Snapshot(at=0.0, stages={st: StageView(0, 0.0, members.get(st, []), [0])
                                    for st in ("fetch", "parse", "store", "retry", "revisit")},
                    paused=False, paused_targets=[], caps={})


def test_an_idle_broker_reads_no_workers_not_running() -> None:
    text = _text(_idle({}))
    assert "fleet no workers" in text and "running" not in text
    assert re.search(r"│\s*0:", text) is None  # no stray colon after a count of nobody
    assert text.count("none") >= 4  # each stage's workers column


def test_a_fleet_with_a_stage_unstaffed_is_partly_running() -> None:
    some = _idle({"fetch": ["fetch-0"], "parse": ["parse-0"], "store": ["store-0"]})
    assert "fleet partly running" in _text(some)
    every = _idle({st: [f"{st}-0"] for st in ("fetch", "parse", "store", "retry", "revisit")})
    assert "fleet running" in _text(every) and "1: retry-0" in _text(every)


def test_top_shows_the_quarantine_app_and_active_quarantines() -> None:
    from crawlfleet.top import active_quarantines
    from streams.control import Quarantine
    assert "active quarantines: none" in _text(_idle({}))
    now = 1_800_000_000_000
    found = [Quarantine("profile", "a.test", "alpha", now + 60_000, "3 blocks within 600s"),
             Quarantine("target", "b.test", "", now + 60_000, "2 of 3 profiles"),
             Quarantine("egress", "a.test", "px1", now - 1, "over")]
    snap = _idle({})
    snap.quarantines = active_quarantines(found, now)
    assert [(q.target, q.scope) for q in snap.quarantines] == [("a.test", "profile"),
                                                               ("b.test", "target")]
    text = _text(snap)
    assert "active quarantines (2)" in text and "alpha" in text and "px1" not in text


def test_the_header_clock_is_utc_like_every_other_time() -> None:
    from core.timefmt import clock_utc, iso_utc
    assert clock_utc(0.0) == "00:00:00Z" and "00:00:00Z" in _text(_idle({}))
    assert iso_utc(1.5) == "1970-01-01T00:00:01.500Z"
