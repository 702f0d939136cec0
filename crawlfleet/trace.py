"""``crawlfleet trace URL``: where a URL went, when, on which worker and version, from SQL.

A job's life is read from five tables, each keyed by the job's page (profile + canonical
URL), and merged in time order:

- ``lineage``: enqueued (seed, link, redirect target, replay, with the page it came from),
  duplicate (suppressed by its dedupe key, with the state it met), parked, released (back
  to the frontier from the retry stage's timer), for the page's first visit and each
  revisit's job;
- ``fetch_events``: every fetch attempt (fetched, retried, dead), with its status, reason,
  worker and version tuple;
- ``page_visits``: every visit's parse and store (one row per page, visit and crawl), with
  ``pages`` (the latest version) for the links and title of the visit that made it;
- ``dead_letters``: the dead letter, with its id for ``crawlfleet dlq show``.

Every event names its crawl (topic prefix; ``(shared)`` for the fleet's namespace): each
row's id is the ``topic:partition:offset`` of the record it came from, and a visit's row
holds it. Every crawl of a data dir shares one store, so a page crawled by two crawls shows
both, each crawl's visits numbered from 0.

A redirect's target is a job of its own, enqueued with the redirecting URL as its parent:
the trace follows each hop (up to ``max_hops``) and shows its events too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.config import Settings
from core.timefmt import iso_utc
from core.urls import canonicalize
from crawlfleet.dlq import crawl_of, select
from schemas.keys import dedupe_key

#: Order of events stamped in the same millisecond: a job's life runs this way.
_RANK = {"enqueued": 0, "duplicate": 1, "parked": 2, "fetched": 3, "retried": 3, "failed": 3,
         "dead": 4, "released": 5, "parsed": 6, "stored": 7}
COLUMNS = ("time", "url", "event", "attempt", "status", "detail", "worker", "version",
           "crawl", "visit")
#: How the shared fleet's namespace (no topic prefix) is named (as ``crawlfleet crawls``).
SHARED = "(shared)"
#: A revisit's job key: the page's key and `` visit:N`` (schemas/keys.job_dedupe_key).
_VISIT_OF_KEY = re.compile(r" visit:(\d+)")
#: A stored title is shown up to this many characters (the pages row holds up to 1,000).
TITLE_SHOWN = 100

_FETCH_EVENTS = {"ok": "fetched", "blocked": "fetched", "retry": "retried", "dead": "failed"}


@dataclass(frozen=True)
class Event:
    ts: datetime
    url: str
    event: str
    attempt: int | None
    status: int | None
    detail: str
    worker: str
    version: str
    crawl: str | None = None  # its topic prefix ("" the shared namespace); None: not known
    visit: int | None = None

    def row(self) -> tuple[str, ...]:
        return (iso_utc(self.ts), self.url,
                self.event, "" if self.attempt is None else str(self.attempt),
                "" if self.status is None else str(self.status), self.detail, self.worker,
                self.version, crawl_label(self.crawl),
                "" if self.visit is None else str(self.visit))


def crawl_label(prefix: str | None) -> str:
    if prefix is None:
        return ""
    return prefix or SHARED


def visit_of_key(key: str) -> int:
    """The visit a job's dedupe key is for (0: the first; a revisit's key says its number)."""
    m = _VISIT_OF_KEY.search(key)
    return int(m[1]) if m else 0


def _time(v: Any) -> datetime:
    ts = v if isinstance(v, datetime) else datetime.fromisoformat(str(v))
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _rows(settings: Settings, head: str, where: str, **values: str) -> list[dict[str, Any]]:
    cols, rows = select(settings, head, where, **values)
    return [dict(zip(cols, r, strict=True)) for r in rows]


def events_of(settings: Settings, url: str, profile: str) -> list[Event]:
    """Every recorded event of one page (profile + canonical URL), unordered: the page's
    key pinned to ``profile`` and, for a job published unpinned, its profile-free key; the
    jobs of its revisits (and replays) carry that key and a suffix."""
    key, loose = dedupe_key(profile, url), dedupe_key(profile, url, pinned=False)
    out: list[Event] = []
    for r in _rows(settings, "SELECT event_id, ts, dedupe_key, state, attempt, parent_url, "
                   "detail, stage, worker, version FROM lineage_v",
                   "dedupe_key IN ({key}, {loose}) OR startsWith(dedupe_key, {key_}) OR "
                   "startsWith(dedupe_key, {loose_})", key=key, loose=loose, key_=key + " ",
                   loose_=loose + " "):
        detail = r["detail"] + (f" from {r['parent_url']}" if r["parent_url"] else "")
        out.append(Event(_time(r["ts"]), url, r["state"], r["attempt"], None,
                         f"{r['stage']}: {detail}".rstrip(": "), r["worker"], r["version"],
                         crawl_of(r["event_id"]), visit_of_key(r["dedupe_key"])))
    visit_rows = _rows(settings, "SELECT crawl, visit, visited_at, parsed_at, parse_worker, "
                       "stored_at, status, outcome FROM page_visits_v",
                       "dedupe_key IN ({key}, {loose})", key=key, loose=loose)
    # (crawl, fetch time) -> visit: the attempt that fetched a visit bears its fetch time
    visits: dict[tuple[str | None, datetime], int] = {
        (str(v["crawl"]), _time(v["visited_at"])): int(v["visit"]) for v in visit_rows}
    for r in _rows(settings, "SELECT event_id, ts, attempt, status, outcome, reason, worker, "
                   "fetcher_version, code_revision FROM fetch_events_v",
                   "url = {url} AND profile = {profile}", url=url, profile=profile):
        detail = r["reason"] or r["outcome"]
        version = " ".join(v for v in (r["fetcher_version"], r["code_revision"]) if v)
        crawl, ts = crawl_of(r["event_id"]), _time(r["ts"])
        visit = visits.get((crawl, ts)) if r["outcome"] in ("ok", "blocked") else None
        out.append(Event(ts, url, _FETCH_EVENTS.get(r["outcome"], r["outcome"]),
                         r["attempt"], r["status"], detail, r["worker"], version, crawl,
                         visit))
    out += _stored(settings, url, key, loose, visit_rows)
    for r in _rows(settings, "SELECT event_id, failed_at, reason, error, attempts, worker, "
                   "version FROM dead_letters_v", "url = {url} AND profile = {profile}",
                   url=url, profile=profile):
        out.append(Event(_time(r["failed_at"]), url, "dead", r["attempts"], None,
                         f"{r['reason']}: {r['error'][:80]} (dlq show {r['event_id']})",
                         r["worker"], r["version"], crawl_of(r["event_id"])))
    return out


def _stored(settings: Settings, url: str, key: str, loose: str,
            visits: list[dict[str, Any]]) -> list[Event]:
    """Each visit's parsed and stored steps (``page_visits``), the links and title shown on
    the visit whose version ``pages`` holds; a page stored before visits were kept: its
    ``pages`` row alone."""
    latest = {_time(r["fetched_at"]): r for r in _rows(
        settings, "SELECT status, title, length(links) AS links, fetch_worker, parse_worker, "
        "fetched_at, parsed_at, stored_at FROM pages_v", "dedupe_key IN ({key}, {loose})",
        key=key, loose=loose)}
    out: list[Event] = []
    for v in visits:
        at, crawl, n = _time(v["visited_at"]), str(v["crawl"]), int(v["visit"])
        page = latest.pop(at, None)
        parsed = _time(v["parsed_at"]) if _time(v["parsed_at"]).year >= 2000 else at
        detail = _page_detail(page) if page is not None else str(v["outcome"])
        out.append(Event(parsed, url, "parsed", None, v["status"], detail,
                         str(v["parse_worker"]), "", crawl, n))
        rows = "page_visits and pages rows" if page is not None else "page_visits row"
        out.append(Event(_time(v["stored_at"]), url, "stored", None, v["status"],
                         f"{v['outcome']}: {rows}", "store", "", crawl, n))
    for page in latest.values():  # stored before page_visits kept its visit
        parsed = _time(page["parsed_at"])
        if parsed.year < 2000:  # stored before pages had parsed_at
            parsed = _time(page["fetched_at"])
        out.append(Event(parsed, url, "parsed", None, page["status"], _page_detail(page),
                         page["parse_worker"], ""))
        out.append(Event(_time(page["stored_at"]), url, "stored", None, page["status"],
                         "pages row", "store", ""))
    return out


def _page_detail(page: dict[str, Any]) -> str:
    return f"{page['links']} links, title {page['title'][:TITLE_SHOWN]!r}"


def redirect_targets(settings: Settings, url: str, profile: str) -> list[str]:
    rows = _rows(settings, "SELECT DISTINCT url FROM lineage_v",
                 "state = 'enqueued' AND detail = 'redirect' AND parent_url = {url} "
                 "AND profile = {profile}", url=url, profile=profile)
    return sorted(str(r["url"]) for r in rows)


def trace(settings: Settings, url: str, profile: str | None = None,
          max_hops: int = 10, crawl: str | None = None) -> list[Event]:
    """The events of ``url`` and of every redirect hop from it, in time order: of every
    crawl the store holds, or only of ``crawl`` (a topic prefix, "" the shared one's)."""
    profile = profile or settings.default_profile
    todo, hops = [canonicalize(url)], dict[str, int]()  # URL → its hop number
    events: list[Event] = []
    while todo and len(hops) <= max_hops:
        u = todo.pop(0)
        if u in hops:
            continue
        hops[u] = len(hops)
        events += events_of(settings, u, profile)
        todo += redirect_targets(settings, u, profile)
    if crawl is not None:
        events = [e for e in events if e.crawl == crawl]
    # In one millisecond, a redirect's answer comes before its target's enqueueing.
    events.sort(key=lambda e: (e.ts, hops[e.url], _RANK.get(e.event, 9)))
    return events
