"""Dead-letter tools: list, show and replay the dead letters in the store.

The ``dead_letters`` table holds every ``crawl.dead`` record whole (its job as JSON, an
undecodable record's bytes as hex); its id is the record's ``topic:partition:offset``.
Replay publishes the selected jobs to the frontier again through the normal path (scope is
the fetch stage's own: robots.txt, the cap, retries, dedupe) with fresh attempts and a
replay mark derived from the dead letter's id (see :mod:`producers.replay`), so replaying
a selection twice fetches each URL once.

Every crawl of a data dir (or of one ClickHouse server) writes the one ``dead_letters``
table, and a dead letter names no crawl: its crawl is the topic prefix of its id (the record
came from ``<prefix>crawl.dead``; a record the store could not decode, from
``<prefix>crawl.<topic>``). Each command acts on one crawl by that prefix (:func:`crawl_where`):
a replay of crawl A selects A's dead letters only, as it publishes to A's frontier only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from core.config import Settings
from core.errors import ConfigError
from infra.store_query import run_query
from infra.views import parse_duration
from producers.replay import ReplayReport, publish_replays, replay_id, replay_job
from schemas.keys import page_key
from schemas.records import CrawlJob

#: A store row's id, ``<prefix>crawl.<topic>:<partition>:<offset>`` (``#...`` after it: a row
#: of its own from that record): group 1 is the prefix of the crawl it came from, "" the
#: shared fleet's. One pattern for Python and for ClickHouse's RE2 (prefixes and topic names
#: are letters, digits, '.', '_' and '-').
PLACE = r"(?s)^(.*)crawl\.[\w-]+:\d+:\d+(?:#.*)?$"
_PLACE = re.compile(PLACE)
LIST_COLUMNS = ("event_id", "failed_at", "reason", "target", "url", "attempts", "worker")
_LIST_HEAD = " ".join(("SELECT", ", ".join(LIST_COLUMNS), "FROM dead_letters_v"))


def sql_string(value: str) -> str:
    """``value`` as a ClickHouse string literal (backslash and quote are its only escapes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def bind(template: str, **values: str | int) -> str:
    """``template`` with each ``{name}`` replaced by its value as a literal: strings quoted
    and escaped, integers as integers. The one place query text meets input."""
    literals = {k: sql_string(v) if isinstance(v, str) else str(int(v))
                for k, v in values.items()}
    return template.format(**literals)


def select(settings: Settings, head: str, where: str, tail: str = "",
           **values: str | int) -> tuple[list[str], list[list[Any]]]:
    """Run ``head WHERE where tail`` (templates) with ``values`` bound into it."""
    return run_query(settings, bind(" ".join((head, "WHERE", where, tail)), **values))


def crawl_of(event_id: str) -> str | None:
    """The topic prefix of the crawl whose record a row was stored from (its id is the
    record's place), or None for an id that is not one."""
    m = _PLACE.fullmatch(event_id)
    return m[1] if m else None


def crawl_where(crawl: str, column: str = "event_id") -> tuple[str, dict[str, str | int]]:
    """A WHERE template (and its values) keeping the rows of one crawl (``crawl``: its topic
    prefix, "" the shared fleet's), read from each row's id as :func:`crawl_of` reads it:
    crawl ``a.`` is not crawl ``b.a.``, nor the shared fleet crawl ``x.``'s."""
    return (f"match({column}, {{place}}) AND extract({column}, {{place}}) = {{crawl}}",
            {"place": PLACE, "crawl": crawl})


def dead_letter_sqls(prefix: str) -> tuple[str, str]:
    """The summary's queries of the crawl ``prefix``'s dead letters: by reason, and the
    targets refused by address. A dead letter's crawl is read from its id as ``dlq`` reads
    it: crawl ``a.`` is not crawl ``b.a.``, and the shared fleet ("") is not every crawl."""
    mine, values = crawl_where(prefix)
    return (bind(f"SELECT reason, count() FROM dead_letters FINAL WHERE {mine} "  # noqa: S608
                 "GROUP BY reason ORDER BY reason", **values),
            bind(f"SELECT target, any(error) FROM dead_letters FINAL WHERE {mine} "  # noqa: S608
                 "AND reason = 'address_not_allowed' GROUP BY target ORDER BY target", **values))


def crawl_phrase(crawl: str) -> str:
    """How a message names a crawl."""
    return f"crawl {crawl}" if crawl else "the shared fleet"


@dataclass(frozen=True)
class Filters:
    reason: str | None = None
    target: str | None = None
    since_s: float | None = None
    #: The crawl's topic prefix ("" the shared fleet's); None: every crawl of the store.
    crawl: str | None = None

    @property
    def empty(self) -> bool:
        """No filter but the crawl: every dead letter (of the crawl)."""
        return not self.reason and not self.target and self.since_s is None

    def where(self) -> tuple[str, dict[str, str | int]]:
        """A WHERE template and its values."""
        parts, values = ["1"], {}  # type: tuple[list[str], dict[str, str | int]]
        if self.crawl is not None:
            part, crawl_values = crawl_where(self.crawl)
            parts.append(part)
            values.update(crawl_values)
        if self.reason:
            parts.append("reason = {reason}")
            values["reason"] = self.reason
        if self.target:
            parts.append("target = {target}")
            values["target"] = self.target
        if self.since_s is not None:
            parts.append("failed_at >= now64(3) - toIntervalMillisecond({since_ms})")
            values["since_ms"] = int(self.since_s * 1000)
        return " AND ".join(parts), values


def list_dead(settings: Settings, filters: Filters,
              limit: int | None = None) -> tuple[list[str], list[list[Any]]]:
    where, values = filters.where()
    if limit:
        values["limit"] = limit
    return select(settings, _LIST_HEAD, where,
                  "ORDER BY failed_at, event_id" + (" LIMIT {limit}" if limit else ""), **values)


def dead_by_crawl(settings: Settings, filters: Filters) -> dict[str, int]:
    """Crawl (topic prefix) → its dead letters ``filters`` select, whatever their crawl: what
    an empty selection names, so the operator sees which crawl holds the ones they meant."""
    where, values = replace(filters, crawl=None).where()
    values["place"] = PLACE
    _, rows = select(settings, "SELECT extract(event_id, {place}) AS crawl, count() "
                     "FROM dead_letters_v", where + " AND match(event_id, {place})",
                     "GROUP BY crawl ORDER BY crawl", **values)
    return {str(c): int(n) for c, n in rows}


def show(settings: Settings, event_id: str, crawl: str | None = None) -> dict[str, Any]:
    """One dead letter, whole, with the version tuple of the attempt that died (from its
    telemetry event, when the fetch stage made it); with ``crawl``, only one of that crawl's
    (another crawl's is refused, naming it)."""
    where, values = Filters(crawl=crawl).where()
    values["id"] = event_id
    cols, rows = select(settings, "SELECT * FROM dead_letters_v", where + " AND event_id = {id}",
                        "", **values)
    if not rows:
        owner = crawl_of(event_id)
        if crawl is not None and owner is not None and owner != crawl and \
                select(settings, "SELECT 1 FROM dead_letters_v", "event_id = {id}",
                       id=event_id)[1]:
            raise ConfigError(f"dead letter {event_id!r} is {crawl_phrase(owner)}'s, not "
                              f"{crawl_phrase(crawl)}'s: pass --crawl {owner or repr('')}")
        where_ = f" of {crawl_phrase(crawl)}" if crawl is not None else ""
        raise ConfigError(f"no dead letter {event_id!r}{where_} (ids: crawlfleet dlq list)")
    record: dict[str, Any] = dict(zip(cols, rows[0], strict=True))
    record["job"] = json.loads(record["job"]) if record.get("job") else None
    record["version_tuple"] = None
    if record.get("url"):
        # the attempt of the dead letter's own crawl: another crawl's workers bear the
        # same names (fetch-0, ...) and may have failed on the same page
        owner = crawl_of(event_id)
        same, crawl_values = crawl_where(owner) if owner is not None else ("1", {})
        vcols, vrows = select(
            settings,
            "SELECT ts, worker, fetcher_version, http_version, tls_version, "
            "profile_bundle_version, code_revision FROM fetch_events_v",
            "url = {url} AND profile = {profile} AND outcome = 'dead' AND worker = {worker} "
            "AND " + same,
            "ORDER BY abs(dateDiff('millisecond', ts, "
            "parseDateTime64BestEffort({failed_at}, 3, 'UTC'))) LIMIT 1",
            url=record["url"], profile=record["profile"], worker=record["worker"],
            failed_at=str(record["failed_at"]), **crawl_values)
        if vrows:
            record["version_tuple"] = dict(zip(vcols, vrows[0], strict=True))
    return record


@dataclass
class ReplayPlan:
    jobs: list[CrawlJob] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # the dead letters replayed
    superseded: int = 0  # older dead letters of a page that has a newer one selected
    unreplayable: int = 0  # undecodable records: no job to replay


def job_of(row: dict[str, Any]) -> CrawlJob:
    """The dead letter's job: its JSON, or (a row stored before the column existed) one
    rebuilt from url, target and profile."""
    if row.get("job"):
        job: CrawlJob = json.loads(row["job"])  # as the store wrote it: a decoded CrawlJob
        job.setdefault("pinned", True)  # stored before schema v3: pinned in effect
        job.setdefault("kind", "page")  # stored before schema v4: a first visit of a page
        job.setdefault("visit", 0)
        job.setdefault("validators", {})
        return job
    return {"url": row["url"], "target": row["target"], "profile": row["profile"],
            "depth": 0, "attempt": 0, "parent_url": None, "last_error": None,
            "priority": 0, "meta": {}, "delay_ms": 0, "pinned": True, "kind": "page",
            "visit": 0, "validators": {}}


def plan_replay(rows: list[dict[str, Any]]) -> ReplayPlan:
    """Pure: the jobs replaying ``rows`` (ordered by failure time) publishes — one per page,
    from its newest dead letter, each marked with that dead letter's replay id."""
    plan = ReplayPlan()
    newest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not row.get("url"):
            plan.unreplayable += 1
            continue
        key = page_key(job_of(row))  # by job type: an unpinned page is one, whatever profile
        if key in newest:
            plan.superseded += 1
        newest[key] = row
    for row in newest.values():
        plan.jobs.append(replay_job(job_of(row), row["event_id"]))
        plan.ids.append(row["event_id"])
    return plan


#: Reasons a replay cannot cure (the site's robots.txt, the address policy): replayed only
#: when ``--reason`` names them.
UNREPLAYABLE = ("robots_disallowed", "address_not_allowed")


def replay(settings: Settings, filters: Filters,
           dry_run: bool = False) -> tuple[ReplayPlan, ReplayReport | None]:
    """Replay the selected dead jobs of the crawl ``settings`` names (its topic prefix): they
    go to that crawl's frontier, so no other crawl's are selected, whatever
    ``filters.crawl`` says (see :func:`producers.replay.publish_replays`). The classes in
    :data:`UNREPLAYABLE` are left out unless ``filters.reason`` names one."""
    where, values = replace(filters, crawl=settings.topic_prefix).where()
    if not filters.reason:
        where += " AND reason NOT IN (" + ", ".join(sql_string(r) for r in UNREPLAYABLE) + ")"
    cols, rows = select(settings, "SELECT event_id, failed_at, url, target, profile, reason, "
                        "job FROM dead_letters_v", where, "ORDER BY failed_at, event_id",
                        **values)
    plan = plan_replay([dict(zip(cols, r, strict=True)) for r in rows])
    if dry_run or not plan.jobs:
        return plan, None
    return plan, publish_replays(plan.jobs, settings)


__all__ = ["PLACE", "UNREPLAYABLE", "Filters", "ReplayPlan", "crawl_of", "crawl_phrase",
           "crawl_where", "dead_by_crawl", "dead_letter_sqls", "list_dead", "parse_duration",
           "plan_replay", "replay", "replay_id", "show"]
