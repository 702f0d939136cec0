"""Parse stage: FetchResult → ParsedPage for the store, discovered links back to the frontier.

Links pass the scope rules and a per-worker recently-emitted filter before they are
published; the authoritative dedupe is the fetch stage's seen store, which owns the
target's partition.

A revisit (``visit`` > 0) is a visit of its own: a 304 to its conditional GET is unchanged
with nothing to parse; a 200 is changed when its text signature (``consumers.signature``)
differs from the last visit's. An unchanged revisit puts no link on the frontier again.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import Message

from consumers.attempts import fetch_event
from consumers.fetch.conditional import NOT_MODIFIED, SIGNATURE
from consumers.html import extract
from consumers.scope import follow
from consumers.signature import text_signature
from consumers.sitemaps import SitemapStep, is_sitemap
from consumers.warc.capture import next_validators, page_fields
from core import __version__
from core.errors import CrawlfleetError, InternalError
from core.profiles import DIRECT, EGRESS_META
from core.revisits import RevisitPolicies, listed_age_s
from core.urls import target_of
from producers.replay import without_replay
from schemas.keys import (
    REDIRECT_HOPS,
    REVISIT_INTERVAL,
    dedupe_key,
    job_key,
    listed_lastmod,
    page_key,
)
from schemas.records import CrawlJob, EnqueuedLink, FetchEvent, FetchResult, ParsedPage
from streams.backpressure import FrontierGate
from streams.batch_stage import BatchStage, NotDueError
from streams.io import Output, raw_value, tp_of

log = logging.getLogger("crawlfleet.parse")


def _url_of(result: Any) -> str:
    job = result.get("job") if isinstance(result, dict) else None
    return str(job.get("url", "")) if isinstance(job, dict) else ""


class RecentSet:
    """A bounded set of recently emitted keys (LRU): cuts repeat links without growing."""

    def __init__(self, capacity: int = 200_000) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def touch(self, key: str) -> bool:
        """True if ``key`` is present, which then counts as just seen (one lookup)."""
        try:
            self._items.move_to_end(key)
        except KeyError:
            return False
        return True

    def add(self, key: str) -> bool:
        """Add ``key``; False if it was already present."""
        if key in self._items:
            self._items.move_to_end(key)
            return False
        self._items[key] = None
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)
        return True


@dataclass(frozen=True)
class Visit:
    """What a fetched page is as a visit: changed since the last one, its signature, and
    the seconds until its next visit (None: none), which its stored row and its revisit
    job both carry."""

    changed: bool
    signature: str
    next_s: float | None = None

    @property
    def next_ms(self) -> int:
        """The next visit's interval in ms (0: none): the revisit job's ``delay_ms``."""
        return int(self.next_s * 1000) if self.next_s is not None else 0


class ParseStage(BatchStage):
    stage = "parse"
    # Up to 2,000 pages per transaction when backlogged: fewer, fuller transactions for the
    # broker and fewer, larger bursts for the store's inserts (measured on the benchmark
    # crawl in 3 and 5 interleaved pairs: 1,000 used ~3% less CPU than 500, 2,000 another
    # ~2-3%). A replay after a crash re-parses at most this many pages.
    batch_size = 2000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recent = RecentSet()
        self._allowed = frozenset(self.settings.allowed_targets)
        self._revisits = RevisitPolicies(self.settings.revisit, self.settings.revisits)
        # Measured off the loop: a slow offsets read must not hold the pages meanwhile.
        self._gate = FrontierGate(self.settings, background=True)
        self._sitemaps = SitemapStep(self.settings, self.encoder, self.topology,
                                     self._count)

    @property
    def _warc(self) -> bool:
        """The store archives pages (WARC): their bodies and captures travel with them."""
        return bool(self.settings.warc_dir)

    def _count(self, name: str, n: int) -> None:
        self.status.add(name, n)
        if name == "sitemap_jobs":
            self._gate.add(n)

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._gate.close()

    def begin_batch(self) -> None:
        self._gate.refresh()
        self._sitemaps.begin_batch()

    def rolled_back(self) -> None:
        # Links remembered from an aborted batch were never published: forget them all.
        self._recent = RecentSet()

    def handle(self, msg: Message) -> list[Output]:
        if self._gate.over():  # fetching is behind: pause this input, do not sleep
            self.status.add("backpressure_holds")
            raise NotDueError(0.5)
        result = self.encoder.decode_as(FetchResult, msg)
        try:
            outputs = self._outputs(result)
        except (CrawlfleetError, NotDueError):
            raise
        except Exception as exc:  # one odd page must not crash the stage (and replay it)
            self.status.add("internal")
            log.exception("parse of %r failed unexpectedly; dead-lettered",
                          _url_of(result))
            err = InternalError.wrap(exc, f"parsing {_url_of(result)!r}")
            if not _url_of(result):  # no job to name: the stage dead-letters the raw record
                raise err from exc
            job = result["job"]
            self.status.add("dead")  # as the stage counts the dead letters it makes
            # The dead letter names the page (url, target, profile), not just its bytes;
            # the attempt's telemetry the page carried becomes a record of its own.
            event = attempt_event(result)
            return [self.encoder.dead(job, raw_value(msg), tp_of(msg)[0], err.reason,
                                      str(err), int(job.get("attempt", 0)) + 1),
                    *([self.encoder.record(self.topology.telemetry, job["target"],
                                           page_key(job).encode(), event)] if event else [])]
        self.status.add("pages")
        return outputs

    def _outputs(self, result: FetchResult) -> list[Output]:
        job = result["job"]
        if is_sitemap(job):  # not a page: expanded into the jobs it lists
            return self._sitemaps.outputs(result, attempt_event(result))
        visit = int(job.get("visit") or 0)
        last = (job.get("validators") or {}).get(SIGNATURE, "")
        if result["status"] == NOT_MODIFIED and visit > 0:
            # unchanged since the last visit: nothing to parse, no links again
            seen = self._planned(result, Visit(False, last))
            return [self._page_output(result, "", "", [], [], seen),
                    *self._next_visit(result, seen)]
        ok = 200 <= result["status"] <= 299
        page = extract(result["body"], result["final_url"], result["content_type"]) if ok \
            else None
        links = page.links if page else []
        signature = text_signature(page.text) if page else ""
        seen = Visit(visit == 0 or not last or signature != last, signature)
        if ok:  # a page whose visit failed (an error, a block, a 404) has no next visit
            seen = self._planned(result, seen)
        # a revisit whose text is the last visit's puts no link on the frontier again
        jobs, enqueued = self._link_jobs(job, links) if seen.changed else ([], [])
        return [self._page_output(result, page.title if page else "",
                                  page.text if page else "", links, enqueued, seen),
                *jobs, *self._next_visit(result, seen)]

    def _planned(self, result: FetchResult, seen: Visit) -> Visit:
        """``seen`` with the interval to the page's next visit, if its target's revisit
        policy has one (from ``changed`` and the interval that led to this visit)."""
        job = result["job"]
        if job.get("kind", "page") != "page":
            return seen
        meta = job.get("meta") or {}
        last = _seconds(meta.get(REVISIT_INTERVAL)) if job.get("visit", 0) else None
        # a sitemap's lastmod: the page's age at this visit sets an adaptive first interval
        age = listed_age_s(listed_lastmod(job), result["fetched_at_ms"]) if last is None \
            else None
        interval = self._revisits.for_target(job["target"]).next_interval(
            last, seen.changed, age)
        return replace(seen, next_s=interval)

    def _next_visit(self, result: FetchResult, seen: Visit) -> list[Output]:
        """The page's next visit, if one is planned (:meth:`_planned`): a job for the
        revisit stage to hold ``delay_ms`` (the interval), sent with this visit's
        validators (a sitemap's lastmod is not among them: it dated the first visit only)."""
        job = result["job"]
        interval = seen.next_s
        if interval is None:
            return []
        meta = job.get("meta") or {}
        nxt: CrawlJob = {
            **job, "attempt": 0, "last_error": None, "delay_ms": seen.next_ms,
            "meta": {**{k: v for k, v in link_meta(meta).items() if k != EGRESS_META},
                     REVISIT_INTERVAL: f"{interval:g}"},
            "visit": int(job.get("visit") or 0) + 1,
            "validators": _validators(result, seen, self._warc)}
        self.status.add("revisits_planned")
        return [self.encoder.job(self.topology.revisits, nxt)]

    def _page_output(self, result: FetchResult, title: str, text: str,
                     links: list[str], enqueued: list[EnqueuedLink], visit: Visit) -> Output:
        job = result["job"]
        key = page_key(job)
        validators = _validators(result, visit, self._warc)
        page: ParsedPage = {
            "dedupe_key": key, "url": job["url"], "final_url": result["final_url"],
            "target": job["target"], "profile": job["profile"], "depth": job["depth"],
            "status": result["status"], "content_type": result["content_type"],
            "title": title, "text": text, "links": links, "body_bytes": len(result["body"]),
            "fetched_at_ms": result["fetched_at_ms"], "fetch_worker": result["worker"],
            "parse_worker": self.worker, "parsed_at_ms": int(time.time() * 1000),
            # the fetching worker's version tuple (empty from a v1 FetchResult)
            "profile_bundle_version": result["profile_bundle_version"],
            "http_version": result["http_version"], "tls_version": result["tls_version"],
            "code_revision": result["code_revision"],
            "enqueued": enqueued, "parse_version": __version__,
            # its attempt's telemetry, for the store's fetch_events row (none from a v2
            # FetchResult: that attempt's event is a crawl.telemetry record)
            "attempt": job["attempt"], "outcome": result["outcome"],
            "reason": result["reason"], "attempt_ms": result["attempt_ms"],
            "fetcher_version": result["fetcher_version"],
            # the visit, and what its next one needs (issue 45)
            "visit": int(job.get("visit") or 0), "changed": visit.changed,
            "signature": visit.signature, "validators": validators,
            "next_visit_ms": visit.next_ms,
            "pinned": bool(job.get("pinned", True)), "priority": job.get("priority", 0),
            "meta": {k: v for k, v in link_meta(job.get("meta")).items() if k != EGRESS_META},
            "egress": attempt_egress(job), **page_fields(result, self._warc)}
        return self.encoder.record(self.topology.parsed, job["target"], key.encode(), page)

    def _link_jobs(self, job: CrawlJob, links: list[str]
                   ) -> tuple[list[Output], list[EnqueuedLink]]:
        """The frontier jobs of ``links`` worth following, and their lineage ``enqueued``
        steps: carried by the page's record (written in the same transaction as the jobs),
        from which the store writes their lineage rows -- one record per link, not two."""
        s = self.settings
        out: list[Output] = []
        enqueued: list[EnqueuedLink] = []
        meta = link_meta(job.get("meta"))
        pinned = bool(job.get("pinned", True))
        for link in links:
            key = dedupe_key(job["profile"], link, pinned)  # == page_key(link_job(...))
            if self._recent.touch(key):  # followed recently: most of a page's links are repeats
                continue
            if not follow(link, job["target"], job["depth"], scope=s.scope,
                          max_depth=s.max_depth, target_mode=s.target_mode,
                          allowed=self._allowed):
                continue
            self._recent.add(key)
            child = link_job(job, link, target_of(link, s.target_mode), meta)
            topic = self.topology.frontier_high if child["priority"] > 0 \
                else self.topology.frontier
            out.append(self.encoder.job(topic, child))
            enqueued.append({"url": link, "target": child["target"], "dedupe_key": key})
        self.status.add("links", len(out))
        self._gate.add(len(out))
        return out, enqueued


def _validators(result: FetchResult, visit: Visit, warc: bool = False) -> dict[str, str]:
    """What the page's next visit sends: the answer's validators and the text signature
    (and, archiving, the stored response a revisit record would refer to)."""
    validators = dict(result.get("validators") or {})
    if visit.signature:
        validators[SIGNATURE] = visit.signature
    if warc:
        validators.update(next_validators(result))
    return validators


def _seconds(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def attempt_event(result: FetchResult) -> FetchEvent | None:
    """The telemetry event a fetched record carries (FetchResult v3), as a record of its
    own: for a page the parse stage dead-letters, whose attempt must still be counted. Keyed
    as the fetch stage keys its events (the page's dedupe key)."""
    if not result.get("outcome"):
        return None  # a v2 record: its event was written on its own
    job = result["job"]
    return fetch_event(job, job["target"], job["profile"], result["status"], result,
                       len(result["body"]), result["worker"], result, result["fetched_at_ms"],
                       "", attempt_egress(job))


def attempt_egress(job: CrawlJob) -> str:
    """The egress the fetched job's attempt went through (the placed job's meta; none: no
    profile was placed, and the attempt went direct)."""
    return (job.get("meta") or {}).get(EGRESS_META, DIRECT)


def link_job(page: CrawlJob, link: str, target: str, meta: dict[str, str]) -> CrawlJob:
    """The frontier job of a link found on ``page``: a job of its page's kind -- the same
    profile, pinned or not (so deduplicated on the same kind of key), one level deeper."""
    return {"url": link, "target": target, "profile": page["profile"],
            "depth": page["depth"] + 1, "attempt": 0, "parent_url": page["url"],
            "last_error": None, "priority": page.get("priority", 0), "meta": meta,
            "delay_ms": 0, "pinned": bool(page.get("pinned", True)), "kind": "page",
            "visit": 0, "validators": {}}


def link_meta(meta: dict[str, str] | None) -> dict[str, str]:
    """The meta a page's links inherit: the user's, without the marks of how the page itself
    was reached -- its replay id, and its redirect hops (a chain's count, not the tree's: a
    site that redirects every link would otherwise stop being followed after
    ``max_redirects`` levels)."""
    return {k: v for k, v in without_replay(meta).items()
            if k not in (REDIRECT_HOPS, REVISIT_INTERVAL)}


__all__ = ["ParseStage", "RecentSet", "attempt_event", "job_key", "link_job", "link_meta"]
