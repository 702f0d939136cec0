"""Replay: the mark, its dedupe key, the plan a selection of dead letters becomes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.errors import ConfigError
from crawlfleet.dlq import Filters, bind, parse_duration, plan_replay, sql_string
from producers.replay import replay_id, replay_job, without_replay
from schemas.keys import REPLAY_META, dedupe_key, job_dedupe_key
from streams.ledger import Ledger, Pending

TP = ("crawl.frontier", 0)
URL = "http://a.test/p"


def _job(**kw: Any) -> dict[str, Any]:
    return {"url": URL, "target": "a.test", "profile": "default", "depth": 3, "attempt": 2,
            "parent_url": "http://a.test/", "last_error": "server_error", "priority": 1,
            "meta": {"k": "v"}, "delay_ms": 15000, **kw}


def _row(event_id: str, url: str = URL, job: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"event_id": event_id, "url": url, "target": "a.test" if url else "",
            "profile": "default" if url else "", "job": json.dumps(job) if job else ""}


def test_replay_id_is_stable_and_differs_per_dead_letter() -> None:
    assert replay_id("crawl.dead:1:5") == replay_id("crawl.dead:1:5")
    assert replay_id("crawl.dead:1:5") != replay_id("crawl.dead:1:6")


def test_a_replayed_job_has_fresh_attempts_its_mark_and_everything_else() -> None:
    job = replay_job(_job(), "crawl.dead:1:5")
    assert job["attempt"] == 0 and job["last_error"] is None and job["delay_ms"] == 0
    assert job["meta"] == {"k": "v", REPLAY_META: replay_id("crawl.dead:1:5")}
    assert (job["depth"], job["priority"], job["parent_url"]) == (3, 1, "http://a.test/")


def test_the_mark_gives_a_key_of_its_own_and_derived_jobs_lose_it() -> None:
    plain, marked = _job(), replay_job(_job(), "d:0:1")
    assert job_dedupe_key(plain) == dedupe_key("default", URL)
    assert job_dedupe_key(marked) == f"default|{URL} replay:{replay_id('d:0:1')}"
    assert job_dedupe_key(marked) != job_dedupe_key(replay_job(_job(), "d:0:2"))
    assert without_replay(marked["meta"]) == {"k": "v"}
    assert without_replay(None) == {}


def test_the_fetch_ledger_lets_a_replay_through_once() -> None:
    """The page's key is DEAD; the replay's key is new, then DONE once fetched."""
    seen: dict[str, tuple[str, int]] = {dedupe_key("default", URL): ("DEAD", 2)}
    led = Ledger()
    led.assign([TP])

    def pending(job: dict[str, Any], offset: int) -> Pending:
        epoch = led.admit(TP, offset)
        assert epoch is not None
        return Pending(TP, offset, epoch, job, job_dedupe_key(job))

    def lookup(_p: int, key: str) -> tuple[str, int] | None:
        return seen.get(key)

    assert led.is_duplicate(pending(_job(attempt=0), 0), lookup)  # the plain job stays dead
    first = pending(replay_job(_job(), "d:0:1"), 1)
    assert not led.is_duplicate(first, lookup)
    led.hold(first)
    again = pending(replay_job(_job(), "d:0:1"), 2)
    assert led.is_duplicate(again, lookup)  # the first one is in flight
    assert led.finish(first, [], ("DONE", 0))
    seen[first.key] = ("DONE", 0)
    assert led.is_duplicate(pending(replay_job(_job(), "d:0:1"), 3), lookup)  # done before
    assert not led.is_duplicate(pending(replay_job(_job(), "d:0:9"), 4), lookup)  # a new one


def test_a_retried_replay_keeps_its_key() -> None:
    job = replay_job(_job(), "d:0:1")
    retried = {**job, "attempt": 1, "last_error": "server_error"}
    assert job_dedupe_key(retried) == job_dedupe_key(job)


def test_plan_takes_each_page_once_from_its_newest_dead_letter() -> None:
    old, new = _job(attempt=2), _job(attempt=2, depth=4)
    plan = plan_replay([_row("d:0:1", job=old), _row("d:0:2", "", None),
                        _row("d:1:7", "http://a.test/other"), _row("d:0:3", job=new)])
    assert plan.ids == ["d:0:3", "d:1:7"]
    assert plan.superseded == 1 and plan.unreplayable == 1
    first, rebuilt = plan.jobs
    assert first["depth"] == 4 and first["meta"][REPLAY_META] == replay_id("d:0:3")
    # A row stored before the job column existed: the job is rebuilt from url and profile.
    assert rebuilt["url"] == "http://a.test/other" and rebuilt["attempt"] == 0


def test_plan_of_the_same_rows_is_the_same_marks() -> None:
    rows = [_row("d:0:1", job=_job()), _row("d:1:2", "http://a.test/x")]
    assert plan_replay(rows).jobs == plan_replay(rows).jobs


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900),
                                                ("2h", 7200), ("1d", 86400), ("1.5h", 5400),
                                                ("1w", 604800)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "-5m", "5 minutes", "1y"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError, match="duration"):
        parse_duration(text)


def test_values_are_quoted_and_escaped_as_literals() -> None:
    assert sql_string("a'b\\c") == "'a\\'b\\\\c'"
    assert bind("x = {v} AND n = {n}", v="' OR 1 --", n=5) == "x = '\\' OR 1 --' AND n = 5"
    where, values = Filters("server_error", "a.test", 600).where()
    assert bind(where, **values) == ("1 AND reason = 'server_error' AND target = 'a.test' AND "
                                     "failed_at >= now64(3) - toIntervalMillisecond(600000)")
    assert Filters().where() == ("1", {})


def test_the_dead_letter_row_keeps_the_whole_record() -> None:
    from datetime import UTC, datetime

    from consumers.store import dead_row, fits
    from infra.clickhouse import DEAD_COLUMNS
    raw = bytes(range(256)) * 64  # 16 KiB: well past the old 4,096 hex-character cut
    d = {"job": _job(), "raw": raw, "source_topic": "crawl.frontier", "reason": "server_error",
         "error": "e" * 1999, "attempts": 3, "worker": "f", "version": "1",
         "failed_at_ms": datetime(2026, 1, 1, tzinfo=UTC)}
    row = dict(zip(DEAD_COLUMNS, fits("dead_letters", dead_row("crawl.dead:0:1", d)),
                   strict=True))
    assert bytes.fromhex(row["raw"]) == raw
    assert json.loads(row["job"]) == _job() and row["error"] == "e" * 1999
    no_job = dict(zip(DEAD_COLUMNS, dead_row("x", {**d, "job": None}), strict=True))
    assert no_job["job"] == "" and no_job["url"] == ""
