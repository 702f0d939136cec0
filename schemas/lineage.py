"""Lineage events: the job states no other record shows, on ``crawl.lineage``.

Fetch attempts (``crawl.telemetry``), pages (``crawl.parsed``) and dead letters already carry
a job's url, profile, worker, time and versions; what they do not show is a job entering the
frontier (a seed, a link, a redirect's target, a replay, a retry released by its timer), a job
suppressed as a duplicate, and a job parked on disk. Each of those is one small record keyed
like the job and partitioned by its target, produced in the transaction (or with the
publish) that does it, so it exists exactly when that step happened.

The record is built here, beside its keys; the encoder that turns it into an output is the
caller's (the stream runtime's ``Encoder``), so this module imports nothing above schemas.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, TypeVar

from core import __version__
from schemas.keys import job_key, page_key
from schemas.records import CrawlJob, LineageEvent
from schemas.topics import Topology

ENQUEUED, DUPLICATE, PARKED, RELEASED = "enqueued", "duplicate", "parked", "released"

T_co = TypeVar("T_co", covariant=True)


class RecordEncoder(Protocol[T_co]):
    """What lineage needs of an encoder: its worker, its topology, and keyed records."""

    @property
    def worker(self) -> str: ...

    @property
    def topology(self) -> Topology: ...

    def record(self, topic: str, target: str, key: bytes, value: Any) -> T_co: ...


def lineage_event(enc: RecordEncoder[T_co], job: CrawlJob, state: str, stage: str,
                  detail: str = "", parent_url: str | None = None) -> T_co:
    """The lineage record of ``job`` reaching ``state`` in ``stage``."""
    event: LineageEvent = {
        "dedupe_key": page_key(job), "url": job["url"],
        "target": job["target"], "profile": job["profile"], "state": state,
        "attempt": int(job.get("attempt", 0)), "parent_url": parent_url, "detail": detail,
        "stage": stage, "worker": enc.worker, "version": __version__,
        "ts_ms": int(time.time() * 1000)}
    return enc.record(enc.topology.lineage, job["target"],
                      job_key(job["target"], job["profile"], job["url"]), event)
