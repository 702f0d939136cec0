"""crawlfleet top's pure parts: the trend line and the rendering of a snapshot."""

from __future__ import annotations

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
