"""``crawlfleet trace URL``: where a URL went, when, on which worker and version, from SQL.

A job's life is read from four tables, each keyed by the job's page (profile + canonical
URL), and merged in time order:

- ``lineage``: enqueued (seed, link, redirect target, replay, with the page it came from),
  duplicate (suppressed by its dedupe key, with the state it met), parked, released (back
  to the frontier from the retry stage's timer);
- ``fetch_events``: every fetch attempt (fetched, retried, dead), with its status, reason,
  worker and version tuple;
- ``pages``: parsed (by which parse worker) and stored (once: the table is keyed by page);
- ``dead_letters``: the dead letter, with its id for ``crawlfleet dlq show``.

A redirect's target is a job of its own, enqueued with the redirecting URL as its parent:
the trace follows each hop (up to ``max_hops``) and shows its events too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.config import Settings
from core.timefmt import iso_utc
from core.urls import canonicalize
from crawlfleet.dlq import select
from schemas.keys import dedupe_key

#: Order of events stamped in the same millisecond: a job's life runs this way.
_RANK = {"enqueued": 0, "duplicate": 1, "parked": 2, "fetched": 3, "retried": 3, "failed": 3,
         "dead": 4, "released": 5, "parsed": 6, "stored": 7}
COLUMNS = ("time", "url", "event", "attempt", "status", "detail", "worker", "version")
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

    def row(self) -> tuple[str, ...]:
        return (iso_utc(self.ts), self.url,
                self.event, "" if self.attempt is None else str(self.attempt),
                "" if self.status is None else str(self.status), self.detail, self.worker,
                self.version)


def _time(v: Any) -> datetime:
    ts = v if isinstance(v, datetime) else datetime.fromisoformat(str(v))
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _rows(settings: Settings, head: str, where: str, **values: str) -> list[dict[str, Any]]:
    cols, rows = select(settings, head, where, **values)
    return [dict(zip(cols, r, strict=True)) for r in rows]


def events_of(settings: Settings, url: str, profile: str) -> list[Event]:
    """Every recorded event of one page (profile + canonical URL), unordered: the page's
    key pinned to ``profile`` and, for a job published unpinned, its profile-free key."""
    key, loose = dedupe_key(profile, url), dedupe_key(profile, url, pinned=False)
    out: list[Event] = []
    for r in _rows(settings, "SELECT ts, state, attempt, parent_url, detail, stage, worker, "
                   "version FROM lineage_v", "dedupe_key IN ({key}, {loose})", key=key,
                   loose=loose):
        detail = r["detail"] + (f" from {r['parent_url']}" if r["parent_url"] else "")
        out.append(Event(_time(r["ts"]), url, r["state"], r["attempt"], None,
                         f"{r['stage']}: {detail}".rstrip(": "), r["worker"], r["version"]))
    for r in _rows(settings, "SELECT ts, attempt, status, outcome, reason, worker, "
                   "fetcher_version, code_revision FROM fetch_events_v",
                   "url = {url} AND profile = {profile}", url=url, profile=profile):
        detail = r["reason"] or r["outcome"]
        version = " ".join(v for v in (r["fetcher_version"], r["code_revision"]) if v)
        out.append(Event(_time(r["ts"]), url, _FETCH_EVENTS.get(r["outcome"], r["outcome"]),
                         r["attempt"], r["status"], detail, r["worker"], version))
    for r in _rows(settings, "SELECT status, title, length(links) AS links, fetch_worker, "
                   "parse_worker, fetched_at, parsed_at, stored_at FROM pages_v",
                   "dedupe_key IN ({key}, {loose})", key=key, loose=loose):
        parsed = _time(r["parsed_at"])
        if parsed.year < 2000:  # stored before pages had parsed_at
            parsed = _time(r["fetched_at"])
        out.append(Event(parsed, url, "parsed", None, r["status"],
                         f"{r['links']} links, title {r['title'][:TITLE_SHOWN]!r}",
                         r["parse_worker"], ""))
        out.append(Event(_time(r["stored_at"]), url, "stored", None, r["status"],
                         "pages row", "store", ""))
    for r in _rows(settings, "SELECT event_id, failed_at, reason, error, attempts, worker, "
                   "version FROM dead_letters_v", "url = {url} AND profile = {profile}",
                   url=url, profile=profile):
        out.append(Event(_time(r["failed_at"]), url, "dead", r["attempts"], None,
                         f"{r['reason']}: {r['error'][:80]} (dlq show {r['event_id']})",
                         r["worker"], r["version"]))
    return out


def redirect_targets(settings: Settings, url: str, profile: str) -> list[str]:
    rows = _rows(settings, "SELECT DISTINCT url FROM lineage_v",
                 "state = 'enqueued' AND detail = 'redirect' AND parent_url = {url} "
                 "AND profile = {profile}", url=url, profile=profile)
    return sorted(str(r["url"]) for r in rows)


def trace(settings: Settings, url: str, profile: str | None = None,
          max_hops: int = 10) -> list[Event]:
    """The events of ``url`` and of every redirect hop from it, in time order."""
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
    # In one millisecond, a redirect's answer comes before its target's enqueueing.
    events.sort(key=lambda e: (e.ts, hops[e.url], _RANK.get(e.event, 9)))
    return events
