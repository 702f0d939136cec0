"""`dlq list | show | replay` act on one crawl of a shared store (issue 44). A dead letter names
no crawl: its crawl is the topic prefix of its id, read the same way in SQL (ClickHouse's RE2,
here the real embedded engine) as in Python (:func:`crawlfleet.dlq.crawl_of`). No broker: a
replay is planned (--dry-run), and the CLI finds the crawl from --crawl or the data dir's
lock."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.config import Settings, load_settings
from core.errors import ConfigError
from crawlfleet import dlq
from crawlfleet.cli import app
from crawlfleet.crawl import hold_data_dir
from infra.clickhouse import DEAD_COLUMNS, Store
from infra.store_query import run_query

#: Ids of five crawls' dead letters, prefixes chosen to trip a prefix test done by
#: ``startsWith``: "b.a." and "crawl.x." begin like "" and "a." ... do.
IDS = {
    "crawl.dead:0:1": "", "crawl.dead:1:2": "",
    "a.crawl.dead:0:1": "a.", "a.crawl.dead:0:2": "a.",
    "a.crawl.parsed:1:5": "a.",  # the store's own: an undecodable record, no job
    "b.a.crawl.dead:0:1": "b.a.",
    "crawl.x.crawl.dead:2:9": "crawl.x.",
    "c1796609957-efecf9.crawl.dead:3:4": "c1796609957-efecf9.",
}


def _row(event_id: str, n: int) -> tuple[object, ...]:
    url = "" if ".parsed:" in event_id else f"http://127.0.0.2:18099/{n}"
    job = {"url": url, "profile": "default", "target": "127.0.0.2", "depth": 0,
           "attempt": 3, "priority": 0, "parent_url": None, "last_error": "http_503",
           "delay_ms": 0, "meta": {}} if url else None
    return (event_id, datetime.now(UTC) - timedelta(seconds=100 - n), url,
            "127.0.0.2" if url else "", "default" if url else "",
            event_id.split(":")[0], "http_503" if url else "undecodable", "HTTP 503", 3,
            "fetch-0", "0.1.0", "00", json.dumps(job) if job else "")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("dlq") / "data"
    store = Store(Settings(data_dir=data))
    store.ensure_schema()
    store.insert("dead_letters", DEAD_COLUMNS,
                 [_row(i, n) for n, i in enumerate(IDS)], "dlq-crawls")
    store.close()
    return data


@pytest.fixture
def s(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    return load_settings(data_dir=store_dir)


@pytest.mark.parametrize(("event_id", "crawl"), [*IDS.items(), ("not a place", None),
                                                 ("a.crawl.dead:0:x", None)])
def test_a_dead_letters_crawl_is_the_prefix_of_its_place(event_id: str,
                                                         crawl: str | None) -> None:
    assert dlq.crawl_of(event_id) == crawl


def test_the_crawl_is_no_filter_an_unfiltered_replay_needs_all_for() -> None:
    assert dlq.Filters(crawl="a.").empty and not dlq.Filters(reason="x", crawl="a.").empty
    assert dlq.Filters().where() == ("1", {})
    where, values = dlq.Filters(crawl="").where()
    assert "extract(event_id, {place}) = {crawl}" in where and values["crawl"] == ""


@pytest.mark.parametrize("crawl", sorted(set(IDS.values())))
def test_list_holds_the_crawls_dead_letters_and_no_other_crawls(s: Settings,
                                                                crawl: str) -> None:
    cols, rows = dlq.list_dead(s, dlq.Filters(crawl=crawl))
    listed = [r[cols.index("event_id")] for r in rows]
    assert sorted(listed) == sorted(i for i, c in IDS.items() if c == crawl)
    assert all(dlq.crawl_of(i) == crawl for i in listed)


@pytest.mark.parametrize("crawl", sorted(set(IDS.values())))
def test_a_crawls_summary_counts_its_own_dead_letters(s: Settings, crawl: str) -> None:
    by_reason, refused = dlq.dead_letter_sqls(crawl)
    _, rows = run_query(s, by_reason)
    assert sum(int(n) for _, n in rows) == sum(1 for c in IDS.values() if c == crawl)
    _, rows = run_query(s, refused)
    assert rows == []


def test_every_crawl_is_counted_on_its_own(s: Settings) -> None:
    expected: dict[str, int] = {}
    for c in IDS.values():
        expected[c] = expected.get(c, 0) + 1
    assert dlq.dead_by_crawl(s, dlq.Filters(crawl="a.")) == expected  # whatever the crawl
    assert len(dlq.list_dead(s, dlq.Filters())[1]) == len(IDS)  # None: every crawl


def test_show_refuses_another_crawls_dead_letter_naming_its_crawl(s: Settings) -> None:
    assert dlq.show(s, "b.a.crawl.dead:0:1", "b.a.")["event_id"] == "b.a.crawl.dead:0:1"
    with pytest.raises(ConfigError, match=r"is crawl b\.a\.'s, not crawl a\.'s: pass "
                                          r"--crawl b\.a\."):
        dlq.show(s, "b.a.crawl.dead:0:1", "a.")
    with pytest.raises(ConfigError, match="is the shared fleet's, not crawl a"):
        dlq.show(s, "crawl.dead:0:1", "a.")
    with pytest.raises(ConfigError,
                       match=re.escape("no dead letter 'a.crawl.dead:0:7' of crawl a.")):
        dlq.show(s, "a.crawl.dead:0:7", "a.")


def test_a_replay_plans_its_own_crawls_dead_letters_only(s: Settings) -> None:
    """What it would publish to crawl a.'s frontier: a.'s jobs, whatever filters.crawl says."""
    for asked in (None, "b.a.", ""):
        plan, report = dlq.replay(s.replace(topic_prefix="a."), dlq.Filters(crawl=asked),
                                  dry_run=True)
        assert report is None
        assert sorted(plan.ids) == ["a.crawl.dead:0:1", "a.crawl.dead:0:2"]
        assert plan.unreplayable == 1  # a.'s undecodable record; no other crawl's
    shared, _ = dlq.replay(s, dlq.Filters(), dry_run=True)
    assert sorted(shared.ids) == ["crawl.dead:0:1", "crawl.dead:1:2"]


def _ids(out: str) -> list[str]:
    """The dead letters' ids a command printed."""
    return sorted(re.findall(r"[\w.-]*crawl\.(?:dead|parsed):\d+:\d+", out))


def _cli(s: Settings, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["dlq", *args],
                                env={"CRAWLFLEET_DATA_DIR": str(s.data_dir), "COLUMNS": "400"})
    return result.exit_code, result.output


def test_the_commands_find_the_crawl_you_mean(s: Settings) -> None:
    code, out = _cli(s, "list", "--crawl", "b.a")  # named, its dot left out
    assert code == 0 and _ids(out) == ["b.a.crawl.dead:0:1"], out
    assert "dead letters of crawl b.a." in out
    code, out = _cli(s, "list")  # nothing runs on the data dir: the shared fleet
    assert code == 0 and _ids(out) == ["crawl.dead:0:1", "crawl.dead:1:2"], out
    with hold_data_dir(s.replace(topic_prefix="c1796609957-efecf9.")):  # a crawl runs
        code, out = _cli(s, "replay", "--all", "--dry-run")
        assert code == 0, out
        assert _ids(out) == ["c1796609957-efecf9.crawl.dead:3:4"], out
        assert "1 to replay in crawl c1796609957-efecf9." in out
        code, out = _cli(s, "show", "a.crawl.dead:0:2")
        assert code == 2 and "is crawl a.'s, not crawl c1796609957-efecf9.'s" in out, out
    code, out = _cli(s, "show", "a.crawl.dead:0:2", "--topic-prefix", "a.")
    assert code == 0 and '"event_id": "a.crawl.dead:0:2"' in out, out


def test_an_empty_selection_names_the_crawls_that_hold_such_dead_letters(s: Settings) -> None:
    code, out = _cli(s, "list", "--crawl", "nosuch")
    assert code == 0 and "0 rows: no dead letters of crawl nosuch." in out, out
    assert "other crawls in this store: the shared fleet (2), crawl a. (3)" in out, out
    assert "pick one with --crawl NAME" in out
