"""Sitemaps as a frontier source: a fetched sitemap becomes the jobs it lists.

A sitemap is a job of kind ``sitemap`` that travels the normal pipeline: the fetch stage
fetches it under every politeness rule a page has (robots.txt, caps, windows, quarantines,
pause, the address guard) with the sitemap byte cap, and the parse stage, seeing the kind,
expands it here instead of parsing HTML. Parsing is ultimate-sitemap-parser's
(``usp.tree.sitemap_from_str``: XML urlsets and indexes, RSS/Atom feeds, text sitemaps, its
DTD/entity hardening); it is given the document and never a web client, so it fetches
nothing: an index's sub-sitemaps come back unfetched, and become sitemap jobs of their
own, one level deeper. Around it go our own guards, before a byte is parsed: the
decompressed-size cap (a ``.xml.gz`` file is inflated here, within the cap), an entry
count (usp keeps every entry in memory, ~2 KB each) and a strict well-formedness check
(usp salvages what it can of broken XML; we dead-letter the document whole, so half a list
is never taken for the site's). Each listed URL passes the same rules as a link: canonical
form, scope, target, and the address policy for IP literals (names are checked where the
fetch connects). A page's ``<lastmod>`` travels in its job (:func:`schemas.keys.listed_lastmod`).
"""

from __future__ import annotations

import logging
import re
import xml.parsers.expat
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from usp.objects.sitemap import AbstractIndexSitemap, InvalidSitemap
from usp.tree import sitemap_from_str

from consumers.scope import follow
from core.config import Settings
from core.errors import (
    CrawlfleetError,
    InvalidURLError,
    SitemapError,
    SitemapTooDeepError,
    SitemapTooLargeError,
)
from core.urls import AddressPolicy, canonicalize, host_of, is_ip, resolve_link, target_of
from producers.replay import without_replay
from schemas.keys import LASTMOD, REDIRECT_HOPS, SITEMAP_DEPTH, page_key
from schemas.lineage import ENQUEUED, lineage_event
from schemas.records import CrawlJob, FetchEvent, FetchResult
from schemas.topics import Topology
from streams.batch_stage import NotDueError
from streams.io import Encoder, Output

SITEMAP = "sitemap"
GZIP_MAGIC = b"\x1f\x8b"
#: Entries a document may list, as a multiple of ``sitemap_max_urls``: usp holds every
#: entry of a document in memory at once, so this bounds a parse worker's peak.
ENTRIES_PER_URL_CAP = 2
#: Jobs one parse transaction takes from sitemaps: a further sitemap waits for the next
#: (its partition held, not the loop), so a batch of sitemaps never holds millions of
#: records in memory or in one transaction. The first sitemap of a batch always goes.
MAX_BATCH_JOBS = 100_000
#: Why a listed URL was not published (status counters ``sitemap_<reason>``).
INVALID, OFF_SCOPE, ADDRESS, OVER_CAP, REPEAT = (
    "invalid", "off_scope", "address", "over_cap", "repeat")

log = logging.getLogger("crawlfleet.sitemaps")


def is_sitemap(job: CrawlJob) -> bool:
    return job.get("kind") == SITEMAP


def sitemap_depth(job: CrawlJob) -> int:
    """How deep in indexes ``job``'s sitemap is (0: published, or named by robots.txt)."""
    value = (job.get("meta") or {}).get(SITEMAP_DEPTH, "0")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 4 else 0


def inflate(body: bytes, cap: int) -> bytes:
    """``body`` as a document: a gzip file (``sitemap.xml.gz``, served without a
    Content-Encoding, so the HTTP client left it compressed) is inflated, never past
    ``cap`` bytes -- a bomb stops at the cap, whatever its ratio."""
    if not body.startswith(GZIP_MAGIC):
        if len(body) > cap:
            raise SitemapTooLargeError(f"sitemap of {len(body)} bytes exceeds cap {cap}")
        return body
    out: list[bytes] = []
    size, data = 0, body
    try:
        while data.startswith(GZIP_MAGIC):  # a gzip file may hold several members
            d = zlib.decompressobj(wbits=31)
            chunk = d.decompress(data, cap - size + 1)
            size += len(chunk)
            if size > cap or d.unconsumed_tail:
                raise SitemapTooLargeError(f"gzip sitemap of {len(body)} bytes inflates "
                                           f"past cap {cap}")
            if not d.eof:
                raise SitemapError("gzip sitemap is truncated")
            out.append(chunk)
            data = d.unused_data
    except zlib.error as exc:
        raise SitemapError(f"gzip sitemap is corrupt: {exc}") from exc
    return b"".join(out)


@dataclass
class Listing:
    """What one sitemap document lists: pages (URL, ``lastmod``) or sub-sitemaps."""

    pages: list[tuple[str, str | None]] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)


_LOC = re.compile(r"loc\s*>")


def _entries(text: str) -> int:
    """An upper bound of a document's entries, counted without parsing."""
    if text.lstrip()[:1] != "<":
        return text.count("\n") + 1
    return max(len(_LOC.findall(text)) // 2, text.count("<item"), text.count("<entry"))


def _well_formed(text: str) -> None:
    """Raise :class:`SitemapError` unless ``text`` is well-formed XML with no DTD."""
    parser = xml.parsers.expat.ParserCreate()

    def refuse(*_args: Any) -> None:
        raise SitemapError("sitemap declares a DTD or entities (refused, as usp does)")

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    try:
        parser.Parse(text, True)
    except xml.parsers.expat.ExpatError as exc:
        raise SitemapError(f"sitemap is not well-formed XML: {exc}") from exc


def _iso(when: datetime | None) -> str | None:
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # a date alone (W3C "2026-11-01") means UTC
    return when.astimezone(UTC).isoformat()


def parse_listing(text: str, max_entries: int) -> Listing:
    """The entries of one sitemap document, by usp, after our guards (see the module)."""
    if _entries(text) > max_entries:
        raise SitemapTooLargeError(f"sitemap lists more than {max_entries} entries")
    xml_doc = text.lstrip()[:1] == "<"
    if xml_doc:
        _well_formed(text)
    tree = sitemap_from_str(text)  # usp: no web client, so it fetches nothing
    if isinstance(tree, InvalidSitemap):
        raise SitemapError(f"not a sitemap: {tree.reason}")
    if isinstance(tree, AbstractIndexSitemap):
        return Listing(sitemaps=[s.url for s in tree.sub_sitemaps])
    # A feed's date is its item's publication (usp keeps it as a news story's)
    pages = [(p.url, _iso(p.last_modified or (p.news_story.publish_date if p.news_story
                                               else None))) for p in tree.pages]
    if not pages and not xml_doc and text.strip():
        raise SitemapError("text sitemap lists no http(s) URL")
    return Listing(pages=pages)


@dataclass(frozen=True)
class UrlRules:
    """The rules every URL a sitemap lists passes, as a link does (see :func:`listed`)."""

    scope: str
    target_mode: str
    allowed: frozenset[str]
    policy: AddressPolicy

    @classmethod
    def of(cls, s: Settings) -> UrlRules:
        return cls(s.scope, s.target_mode, frozenset(s.allowed_targets),
                   AddressPolicy.of(s.allow_private, s.allow_hosts))


def listed(raw: str, from_target: str, rules: UrlRules) -> str:
    """The canonical form of a URL a sitemap (or robots.txt) on ``from_target`` lists, or
    the reason it is not followed: :data:`INVALID`, :data:`ADDRESS` (an IP literal, or
    ``localhost``, the policy refuses; a name is checked where the fetch connects) or
    :data:`OFF_SCOPE` (the scope rule of a link). Returns the URL when it passes."""
    try:
        url = canonicalize(raw)
    except InvalidURLError:
        return INVALID
    host = host_of(url)
    ip = "127.0.0.1" if host == "localhost" or host.endswith(".localhost") else host
    # A name (its addresses are checked where the fetch connects) ends in a letter; the
    # check skips ip_address's exception for it, most of this function's cost.
    if (ip[-1:].isdigit() or ":" in ip) and is_ip(ip) and not rules.policy.allows(host, ip):
        return ADDRESS
    if not follow(url, from_target, 0, scope=rules.scope, max_depth=-1,
                  target_mode=rules.target_mode, allowed=rules.allowed):
        return OFF_SCOPE
    return url


def _meta(job: CrawlJob) -> dict[str, str]:
    """The meta a sitemap's jobs inherit: the user's, none of how the sitemap was reached."""
    return {k: v for k, v in without_replay(job.get("meta")).items()
            if k not in (REDIRECT_HOPS, SITEMAP_DEPTH)}


def page_job(sitemap: CrawlJob, url: str, target: str, lastmod: str | None,
             meta: dict[str, str]) -> CrawlJob:
    """The job of a page a sitemap lists: a seed of the sitemap's depth, profile and pin,
    its ``lastmod`` in ``validators`` (read it with :func:`schemas.keys.listed_lastmod`)."""
    return {"url": url, "target": target, "profile": sitemap["profile"],
            "depth": sitemap["depth"], "attempt": 0, "parent_url": sitemap["url"],
            "last_error": None, "priority": sitemap.get("priority", 0), "meta": meta,
            "delay_ms": 0, "pinned": bool(sitemap.get("pinned", True)), "kind": "page",
            "visit": 0, "validators": {LASTMOD: lastmod} if lastmod else {}}


def sitemap_job(parent: CrawlJob, url: str, target: str, depth: int,
                parent_url: str | None = None) -> CrawlJob:
    """A sitemap job found by ``parent`` (an index, or a job whose robots.txt named it)."""
    return {**page_job(parent, url, target, None, {**_meta(parent), SITEMAP_DEPTH: str(depth)}),
            "parent_url": parent_url or parent["url"], "kind": SITEMAP}


@dataclass
class Expansion:
    """A sitemap's jobs to publish, its sub-sitemaps past the depth cap (dead letters),
    and the listed URLs not followed, counted by reason."""

    jobs: list[CrawlJob] = field(default_factory=list)
    too_deep: list[CrawlJob] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)


def expand(job: CrawlJob, body: bytes, s: Settings, rules: UrlRules) -> Expansion:
    """The jobs the sitemap ``job`` fetched as ``body`` lists (pure: no I/O). Raises
    :class:`SitemapError` / :class:`SitemapTooLargeError` for a document that cannot be
    expanded: the caller dead-letters it whole."""
    # utf-8-sig: a byte-order mark would hide the XML's first "<" (as usp decodes it too)
    text = inflate(body, s.sitemap_max_bytes).decode("utf-8-sig", "replace")
    listing = parse_listing(text, ENTRIES_PER_URL_CAP * s.sitemap_max_urls)
    out = Expansion()
    per_target: Counter[str] = Counter()
    seen: set[str] = {job["url"]}
    depth = sitemap_depth(job) + 1
    meta = _meta(job)
    entries: Iterable[tuple[str, str | None]] = listing.pages or \
        ((u, None) for u in listing.sitemaps)
    for raw, lastmod in entries:
        url = listed(raw, job["target"], rules)
        if url in (INVALID, OFF_SCOPE, ADDRESS):
            out.dropped[url] += 1
            continue
        if url in seen:
            out.dropped[REPEAT] += 1
            continue
        seen.add(url)
        target = target_of(url, s.target_mode)
        if per_target[target] >= s.sitemap_max_urls:
            out.dropped[OVER_CAP] += 1
            continue
        per_target[target] += 1
        if listing.pages:
            out.jobs.append(page_job(job, url, target, lastmod, meta))
        elif depth > s.sitemap_max_depth:
            out.too_deep.append(sitemap_job(job, url, target, depth))
        else:
            out.jobs.append(sitemap_job(job, url, target, depth))
    return out


def robots_sitemaps(job: CrawlJob, robots_url: str, lines: Iterable[str],
                    rules: UrlRules, max_urls: int) -> list[CrawlJob]:
    """The sitemap jobs of robots.txt's ``Sitemap:`` lines, found while fetching ``job``
    (its profile and pin): depth 0, each URL passing the rules of a listed one."""
    out: list[CrawlJob] = []
    seen: set[str] = set()
    for line in lines:
        absolute = resolve_link(robots_url, line.strip())
        url = listed(absolute, job["target"], rules) if absolute else INVALID
        if url in (INVALID, OFF_SCOPE, ADDRESS) or url in seen:
            continue
        seen.add(url)
        out.append(sitemap_job(job, url, target_of(url, rules.target_mode), 0, robots_url))
        if len(out) >= max_urls:
            break
    return out


class SitemapStep:
    """The parse stage's part for sitemap jobs: a fetched sitemap → its jobs (frontier,
    with their lineage), dead letters for what cannot be expanded, and its attempt's
    telemetry event (a sitemap is no page: nothing goes to ``crawl.parsed``)."""

    def __init__(self, s: Settings, encoder: Encoder, topology: Topology,
                 count: Any) -> None:
        self.s, self.enc, self.topology, self.count = s, encoder, topology, count
        self.rules = UrlRules.of(s)
        self.batch_jobs = 0  # jobs this transaction took from sitemaps so far
        logging.getLogger("usp").setLevel(logging.ERROR)  # our guards report what matters

    def begin_batch(self) -> None:
        self.batch_jobs = 0

    def outputs(self, result: FetchResult, event: FetchEvent | None) -> list[Output]:
        """The records of one fetched sitemap; ``count(name, n)`` hears the counters.
        Raises :class:`NotDueError` when this transaction took its share of sitemap jobs."""
        job = result["job"]
        if self.batch_jobs >= MAX_BATCH_JOBS:
            raise NotDueError(0.0)
        out = [self.enc.record(self.topology.telemetry, job["target"],
                               page_key(job).encode(), event)] if event else []
        self.count("sitemaps", 1)
        if not 200 <= result["status"] <= 299:
            return out  # its fetch event says what the site answered
        try:
            found = expand(job, result["body"], self.s, self.rules)
        except CrawlfleetError as exc:
            self.count("sitemaps_dead", 1)
            log.warning("sitemap %s dead-lettered: %s", job["url"], exc)
            return [*out, self.enc.dead(job, None, self.topology.fetched, exc.reason,
                                        str(exc), int(job.get("attempt", 0)) + 1)]
        for child in found.jobs:
            topic = self.topology.frontier_high if child["priority"] > 0 \
                else self.topology.frontier
            out.append(self.enc.job(topic, child))
            out.append(lineage_event(self.enc, child, ENQUEUED, "parse", SITEMAP, job["url"]))
        for child in found.too_deep:
            err = SitemapTooDeepError(f"{child['url']} is nested {sitemap_depth(child)} "
                                      f"deep, past sitemap_max_depth {self.s.sitemap_max_depth}")
            out.append(self.enc.dead(child, None, self.topology.fetched, err.reason,
                                     str(err), 1))
        self.batch_jobs += len(found.jobs)
        self.count("sitemap_jobs", len(found.jobs))
        for reason, n in found.dropped.items():
            self.count(f"sitemap_{reason}", n)
        return out


def fetch_cap(job: CrawlJob, s: Settings) -> int | None:
    """The body cap of ``job``'s request: a sitemap's own, else the page default (None)."""
    return s.sitemap_max_bytes if is_sitemap(job) else None


__all__ = ["Expansion", "Listing", "SitemapStep", "UrlRules", "expand",
           "fetch_cap", "inflate", "is_sitemap", "listed", "page_job", "parse_listing",
           "robots_sitemaps", "sitemap_depth", "sitemap_job"]
