"""Lineage events: the job states no other record shows, on ``crawl.lineage``.

Fetch attempts (``crawl.telemetry``), pages (``crawl.parsed``) and dead letters already carry
a job's url, profile, worker, time and versions; what they do not show is a job entering the
frontier (a seed, a link, a redirect's target, a replay, a retry released by its timer), a job
suppressed as a duplicate, and a job parked on disk. Each of those is one small record keyed
like the job and partitioned by its target, produced in the transaction (or with the
publish) that does it, so it exists exactly when that step happened.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from core import __version__
from core.urls import dedupe_key
from schemas.records import CrawlJob, LineageEvent
from streams.io import Encoder, Output, job_key

ENQUEUED, DUPLICATE, PARKED, RELEASED = "enqueued", "duplicate", "parked", "released"


def page_key(job: Mapping[str, Any]) -> str:
    """The page's dedupe key of ``job`` by its type (:func:`core.urls.dedupe_key`): pinned
    ``profile|URL``, unpinned ``*|URL``. A job without ``pinned`` (parked on disk or stored
    as JSON before schema v3) was pinned in effect: its key was always ``profile|URL``."""
    return dedupe_key(job["profile"], job["url"], bool(job.get("pinned", True)))


def lineage_event(enc: Encoder, job: CrawlJob, state: str, stage: str,
                  detail: str = "", parent_url: str | None = None) -> Output:
    """The lineage record of ``job`` reaching ``state`` in ``stage``."""
    event: LineageEvent = {
        "dedupe_key": page_key(job), "url": job["url"],
        "target": job["target"], "profile": job["profile"], "state": state,
        "attempt": int(job.get("attempt", 0)), "parent_url": parent_url, "detail": detail,
        "stage": stage, "worker": enc.worker, "version": __version__,
        "ts_ms": int(time.time() * 1000)}
    return enc.record(enc.topology.lineage, job["target"],
                      job_key(job["target"], job["profile"], job["url"]), event)
