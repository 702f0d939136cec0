"""The figures behind one refresh of the page: every asked-for panel's view over one window,
run one after the other through a query function (the server passes
:func:`infra.store_query.run_query`), each capped at ``max_rows`` result rows."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from core.errors import CrawlfleetError, QueryError
from core.timefmt import iso_utc
from crawlfleet.dashboard.panels import Panel
from crawlfleet.dashboard.params import DataRequest, window_seconds
from infra.views import View, bucket_for, expand

Query = Callable[[str], tuple[list[str], list[list[Any]]]]
#: Rows a panel shows at most (a table of targets on a big crawl): the rest is cut, said so.
MAX_ROWS = 2000

#: Age in seconds of the store's oldest record of any kind (``all``'s window), -1 if empty.
SPAN_SQL = """SELECT max(age) FROM (
    SELECT dateDiff('second', min(ts), now64(3)) AS age FROM queue_samples HAVING count() > 0
    UNION ALL SELECT dateDiff('second', min(ts), now64(3)) FROM fetch_events HAVING count() > 0
    UNION ALL SELECT dateDiff('second', min(stored_at), now64(3)) FROM pages
        HAVING count() > 0
    UNION ALL SELECT dateDiff('second', min(failed_at), now64(3)) FROM dead_letters
        HAVING count() > 0
    UNION ALL SELECT dateDiff('second', min(at), now64(3)) FROM quarantines HAVING count() > 0
    UNION ALL SELECT -1)"""


def capped(sql: str, max_rows: int) -> str:
    """``sql`` returning at most ``max_rows + 1`` rows (one more tells that rows were cut)."""
    # A view's own text from infra/sql/views, never the browser's: nothing to inject.
    return f"SELECT * FROM (\n{sql}\n) LIMIT {int(max_rows) + 1}"  # noqa: S608


def store_age(query: Query) -> float | None:
    _, rows = query(SPAN_SQL)
    age = rows[0][0] if rows else -1
    return None if age is None or float(age) < 0 else float(age)


def panel_data(panel: Panel, view: View, since_s: int, bucket_s: int, query: Query,
               max_rows: int = MAX_ROWS) -> dict[str, Any]:
    """One panel's rows for the window, or the engine's reason it has none (any other
    error, such as no store or one held too long, is the whole page's: raised)."""
    try:
        cols, rows = query(capped(expand(view.sql, since_s, bucket_s), max_rows))
    except QueryError as exc:
        return {"columns": [], "rows": [], "truncated": False, "error": str(exc),
                "empty": None}
    return {"columns": cols, "rows": rows[:max_rows], "truncated": len(rows) > max_rows,
            "error": None, "empty": None if rows else panel.empty}


def window_data(req: DataRequest, panels: dict[str, tuple[Panel, View]], query: Query,
                approved: dict[str, Any] | None = None, max_rows: int = MAX_ROWS
                ) -> dict[str, Any]:
    """Every asked-for panel over ``req.window``: the payload of one ``/api/data`` answer.

    The window and its bucket are fixed once, so every panel covers the same span and a
    ``crawlfleet sql --view NAME --since {since_s}s`` run shows the same figures."""
    began = time.monotonic()
    at = iso_utc(time.time())  # the figures are as of the start of their queries
    try:
        age = store_age(query) if req.window == "all" else None
    except CrawlfleetError as exc:  # no store yet, or one held: said once, for the page
        return {"window": req.window, "since_s": None, "bucket_s": None, "panels": {},
                "store_error": str(exc), "at": at}
    since_s = window_seconds(req.window, age)
    bucket_s = bucket_for(since_s)
    out: dict[str, Any] = {}
    store_error = None
    for name in req.panels:
        panel, view = panels[name]
        try:
            out[name] = panel_data(panel, view, since_s, bucket_s, query, max_rows)
        except CrawlfleetError as exc:  # no store, or one held: the rest would say the same
            store_error = str(exc)
            break
    return {"window": req.window, "since_s": since_s, "bucket_s": bucket_s, "panels": out,
            "store_error": store_error, "approved": approved,
            "at": at, "took_s": round(time.monotonic() - began, 3)}

