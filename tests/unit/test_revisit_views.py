"""The revisits view (issue 45.3) on the embedded engine, over visits whose due times are
known: due now, how long they wait, planned, done by outcome and how late they came, each
number worked out by hand here; and a store made before page_visits had next_due_at gains
it, its old rows read as planning no visit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.config import Settings
from infra.clickhouse import DEAD_COLUMNS, VISIT_COLUMNS, Store, StoreOwnership
from infra.views import expand, load_views
from tests.unit.conftest import OLD_PAGE_VISITS

NONE = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(embedded_settings: Settings) -> Iterator[Store]:
    yield from _opened(embedded_settings)


def _opened(s: Settings) -> Iterator[Store]:
    ownership = StoreOwnership(s)
    assert ownership.claim()
    st = Store(s, owner=True)
    try:
        st.ensure_schema()
        yield st
    finally:
        st.close()
        ownership.release()


def _visit(page: str, visit: int, target: str, visited: datetime, outcome: str,
           due: datetime) -> tuple[Any, ...]:
    """A page_visits row (VISIT_COLUMNS) of page ``page`` on ``target``."""
    status = 304 if outcome == "not_modified" else 200
    return (f"default|http://{target}/{page}", visit, f"http://{target}/{page}", target,
            "default", visited, status, outcome, int(outcome in ("new", "changed")), "sig",
            "", "", due, "", visited, "parse-0")


def _dead(url: str, target: str, at: datetime) -> tuple[Any, ...]:
    return (f"d:{url}:{at.timestamp()}", at, url, target, "default", "crawl.frontier",
            "robots_disallowed", "disallowed", 1, "fetch-0", "x", "", "")


def _view(st: Store) -> tuple[dict[str, dict[str, Any]], float]:
    """The view's rows by target, and the seconds the query took (waits grow by it)."""
    began = time.monotonic()
    cols, rows = st.query(expand(load_views()["revisits"].sql, 3600))
    return ({r[0]: dict(zip(cols, r, strict=True)) for r in rows},
            time.monotonic() - began)


def _near(got: float, want: float, slack: float) -> bool:
    """``got`` is ``want`` seconds, measured between 0 and ``slack`` seconds later."""
    return want - 0.01 <= got <= want + slack


def test_revisits_due_waiting_planned_done_and_late_per_target(store: Store) -> None:
    now = datetime.now(UTC)

    def ago(s: float) -> datetime:
        return now - timedelta(seconds=s)

    visits = [
        # t1/a: due 900 s ago, came 880 s ago (20 s late, changed); due 600 s ago, came 560
        # s ago (40 s late, a 304); due 300 s ago, not come: due now, waiting 300 s.
        _visit("a", 0, "t1", ago(1000), "new", ago(900)),
        _visit("a", 1, "t1", ago(880), "changed", ago(600)),
        _visit("a", 2, "t1", ago(560), "not_modified", ago(300)),
        # t1/b: due 100 s ago, came 40 s ago (60 s late, unchanged); next in 200 s: planned.
        _visit("b", 0, "t1", ago(500), "new", ago(100)),
        _visit("b", 1, "t1", ago(40), "unchanged", ago(-200)),
        # t1/c: due 200 s ago, then dead-lettered 150 s ago: not coming, not due.
        _visit("c", 0, "t1", ago(400), "new", ago(200)),
        # t1/d: due 50 s ago; its only dead letter is older than that: due, waiting 50 s.
        _visit("d", 0, "t1", ago(3000), "new", ago(50)),
        # t1/f: due 100 s ago: waiting 100 s.
        _visit("f", 0, "t1", ago(700), "new", ago(100)),
        # t1/e: policy once: no next visit.
        _visit("e", 0, "t1", ago(700), "new", NONE),
        # t2/g: a revisit of a visit stored before next_due_at was kept: done, lateness
        # unknown; it plans none itself.
        _visit("g", 0, "t2", ago(900), "new", NONE),
        _visit("g", 1, "t2", ago(10), "changed", NONE),
        # t2/h: its revisit came 2 h ago (outside the 1 h window, not counted as done); next
        # in 100 s: planned.
        _visit("h", 0, "t2", ago(9000), "new", ago(7300)),
        _visit("h", 1, "t2", ago(7200), "changed", ago(-100)),
    ]
    store.insert("page_visits", VISIT_COLUMNS, visits, "visits-1")
    # a replayed batch, cut differently: FINAL collapses its copy of a/1
    store.insert("page_visits", VISIT_COLUMNS, [visits[1]], "visits-2")
    store.insert("dead_letters", DEAD_COLUMNS,
                 [_dead("http://t1/c", "t1", ago(150)), _dead("http://t1/d", "t1", ago(600))],
                 "dead-1")
    got, took = _view(store)
    slack = (datetime.now(UTC) - now).total_seconds() + took
    t1, t2 = got["t1"], got["t2"]
    assert (t1["due_now"], t1["planned"]) == (3, 1)  # a, d, f; b
    assert _near(t1["waiting_p50_s"], 100, slack) and _near(t1["waiting_max_s"], 300, slack)
    assert (t1["done"], t1["changed"], t1["unchanged"], t1["not_modified"]) == (3, 1, 1, 1)
    assert (t1["late_p50_s"], t1["late_max_s"]) == (40.0, 60.0)  # of 20, 40, 60 s
    assert (t2["due_now"], t2["planned"], t2["done"], t2["changed"]) == (0, 1, 1, 1)
    assert t2["waiting_p50_s"] is None and t2["waiting_max_s"] is None
    assert t2["late_p50_s"] is None and t2["late_max_s"] is None
    assert set(got) == {"t1", "t2"}


def test_a_store_made_before_next_due_at_gains_it(embedded_settings: Settings) -> None:
    s = embedded_settings
    ownership = StoreOwnership(s)
    assert ownership.claim()
    old = Store(s, owner=True)
    old.command(OLD_PAGE_VISITS)
    at = datetime.now(UTC) - timedelta(seconds=30)
    before = VISIT_COLUMNS.index("next_due_at")  # the columns an older store had
    old.insert("page_visits", VISIT_COLUMNS[:before],
               [_visit("a", 0, "t", at, "new", NONE)[:before]], "old")
    old.close()
    ownership.release()
    for st in _opened(s):  # the next store worker's start brings the schema up to date
        assert st.scalar("SELECT toUnixTimestamp64Milli(next_due_at) FROM page_visits_v") == 0
        st.insert("page_visits", VISIT_COLUMNS,
                  [_visit("a", 1, "t", at + timedelta(seconds=5), "unchanged",
                          at - timedelta(seconds=1))], "new")
        got, _ = _view(st)
        # the old visit planned nothing: its revisit's lateness is unknown; the new one's
        # due time has passed, with no later visit: due now
        assert (got["t"]["done"], got["t"]["late_max_s"], got["t"]["due_now"]) == (1, None, 1)
