"""The crawl's progress line: a stage whose lag is unknown reads ``?``, never ``-1``."""

from __future__ import annotations

from crawlfleet.crawl import _progress_line

STATUSES = [{"stage": "fetch", "counters": {"fetched": 12, "retries": 1, "dead": 0}},
            {"stage": "store", "counters": {"stored_pages": 9}}]


def test_an_unknown_lag_reads_as_a_question_mark() -> None:
    line = _progress_line(STATUSES, {"fetch": 3, "parse": -1, "store": 0}, 4.0)
    assert "fetched 12  stored 9  retries 1  dead 0" in line
    assert line.endswith("queues: fetch 3 parse ? store 0")
    assert "-1" not in line
