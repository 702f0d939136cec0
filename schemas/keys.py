"""The keys records travel under, beside the topology that defines those records.

Every stage derives the same key from the same job, so these rules live once, at the
bottom: the page's *dedupe key* (the semantic key of a page fetch: what ``crawl.seen``,
the store's ReplacingMergeTree and lineage all use), a job's Kafka record key, and the
reserved meta names that change a key (a replay's id) or travel with a job (redirect hops).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The profile part of an unpinned job's dedupe key (never a profile's name).
UNPINNED = "*"
#: Job meta key of the replay id (reserved, like :data:`REDIRECT_HOPS`):
#: see :mod:`producers.replay`.
REPLAY_META = "replay_id"
#: Job meta key: redirect hops that led to this job (the max-redirects cap spans jobs).
REDIRECT_HOPS = "redirect_hops"
#: Job meta key of a revisit: the interval (s) that led to it, which an adaptive revisit
#: policy shrinks or grows for the next one (``core.revisits``).
REVISIT_INTERVAL = "revisit_interval_s"

#: Job meta key of a sitemap job's nesting depth (0: published or named by robots.txt).
SITEMAP_DEPTH = "sitemap_depth"
#: Job validators key: the ``<lastmod>`` a sitemap listed for the page (ISO 8601, UTC).
LASTMOD = "lastmod"


def listed_lastmod(job: Mapping[str, Any]) -> str | None:
    """When the sitemap that listed ``job``'s page says it last changed (ISO 8601 in UTC,
    e.g. ``2026-11-01T10:00:00+00:00``), or None: the one reader of it, for the revisit
    policy. It travels in ``validators`` (never inherited by the page's links, unlike
    ``meta``), set only by :func:`consumers.sitemaps.page_job`."""
    value = (job.get("validators") or {}).get(LASTMOD)
    return str(value) if value else None


def dedupe_key(profile: str, canonical_url: str, pinned: bool = True) -> str:
    """Semantic key of a page fetch, the one rule for every job type.

    Pinned (``profile|URL``): the same page under the same identity is one job, and two
    identities are two legitimate fetches. Unpinned (``*|URL``): the profile is only where
    the job starts, so the key leaves it out -- moving the job to another profile (after a
    block or a quarantine) can never let one URL be fetched successfully and stored twice.
    """
    return f"{profile if pinned else UNPINNED}|{canonical_url}"


def page_key(job: Mapping[str, Any]) -> str:
    """The page's dedupe key of ``job`` by its type (:func:`dedupe_key`): pinned
    ``profile|URL``, unpinned ``*|URL``. A job without ``pinned`` (parked on disk or stored
    as JSON before schema v3) was pinned in effect: its key was always ``profile|URL``."""
    return dedupe_key(job["profile"], job["url"], bool(job.get("pinned", True)))


def job_dedupe_key(job: Mapping[str, Any]) -> str:
    """The key the fetch stage dedupes ``job`` on: the page's (:func:`page_key`, by job
    type: pinned ``profile|URL``, unpinned ``*|URL``), with its visit number for a revisit
    (CrawlJob v4: the seen store never suppresses a due revisit, and never lets one visit
    be stored twice), and the replay id of a replay.

    Canonical URLs hold no space, so a suffix can never make another page's key.
    """
    key = visit_key(job, int(job.get("visit") or 0))
    rid = (job.get("meta") or {}).get(REPLAY_META)
    return f"{key} replay:{rid}" if rid else key


def visit_key(job: Mapping[str, Any], visit: int) -> str:
    """The dedupe key of visit ``visit`` of ``job``'s page (no replay id): the page's key
    for visit 0, ``visit:n`` after it for a revisit (what pruning an earlier visit names)."""
    key = page_key(job)
    return f"{key} visit:{visit}" if visit > 0 else key


def job_key(target: str, profile: str, url: str) -> bytes:
    """The Kafka key of a job's records (frontier, results, lineage): one key per
    (target, profile, URL), partitioned by the target alone."""
    return f"{target}|{profile}|{url}".encode()
