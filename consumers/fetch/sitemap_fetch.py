"""The fetch stage's part for sitemaps: the body a sitemap's record may carry, and the
sitemap jobs a robots.txt names.

A sitemap may be 50 MB decompressed (``sitemap_max_bytes``); a fetched record may not (the
topics take 16 MB). A plain body past :data:`PACK_OVER` is gzip-compressed (level 1: XML
shrinks 8-15 times, for ~0.1 s per 10 MB) and the parse stage inflates it within the same
cap; one still past :data:`RECORD_BODY_BYTES` is dead-lettered ``sitemap_too_large``.

robots.txt's ``Sitemap:`` lines become jobs once per fetch of the file, for a profile with
``follow_sitemaps``: the targets' owner keeps the lines of each fetched file until the
next job of that origin finishes, which carries them (same transaction), and the seen
store dedupes them by key like any job. An aborted transaction loses them until the file
is fetched again (``robots_ttl_s``): sitemaps are a hint, the pages are still crawlable.
"""

from __future__ import annotations

import dataclasses
import gzip

from consumers.fetch.http import Response
from consumers.sitemaps import GZIP_MAGIC, UrlRules, is_sitemap, robots_sitemaps
from core.config import Settings
from core.errors import SitemapTooLargeError
from core.urls import origin_of
from schemas.lineage import ENQUEUED, lineage_event
from schemas.records import CrawlJob
from schemas.topics import Topology
from streams.io import Encoder, Output

#: A sitemap body this large or larger travels compressed.
PACK_OVER = 1024 * 1024
#: The most a sitemap's record may carry (the fetched topic takes 16 MB records).
RECORD_BODY_BYTES = 12 * 1024 * 1024


def packed(job: CrawlJob, resp: Response) -> Response:
    """``resp`` with a body its record can carry (see the module); pages pass as they are."""
    if not is_sitemap(job) or len(resp.body) < PACK_OVER:
        return resp
    body = resp.body if resp.body.startswith(GZIP_MAGIC) \
        else gzip.compress(resp.body, compresslevel=1, mtime=0)
    if len(body) > RECORD_BODY_BYTES:
        raise SitemapTooLargeError(f"sitemap {job['url']} is {len(body)} bytes compressed, "
                                   f"past the {RECORD_BODY_BYTES} a record carries")
    return dataclasses.replace(resp, body=body)


def robots_outputs(enc: Encoder, topo: Topology, job: CrawlJob, profile: str,
                   lines: tuple[str, ...], s: Settings) -> list[Output]:
    """The frontier records (and lineage) of a fetched robots.txt's ``Sitemap:`` lines,
    carried by ``job`` placed on ``profile``: none unless that profile follows them."""
    placed = s.profile_table.get(profile or job["profile"])
    if not lines or placed is None or not placed.follow_sitemaps:
        return []
    robots_url = origin_of(job["url"]) + "/robots.txt"
    out: list[Output] = []
    for child in robots_sitemaps(job, robots_url, lines, UrlRules.of(s), s.sitemap_max_urls):
        topic = topo.frontier_high if child["priority"] > 0 else topo.frontier
        out += [enc.job(topic, child),
                lineage_event(enc, child, ENQUEUED, "fetch", "robots_sitemap", robots_url)]
    return out
