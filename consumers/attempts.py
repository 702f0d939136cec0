"""A fetch attempt's telemetry event, built one way wherever it is written.

The fetch stage writes the event of an attempt that stored nothing (a retry, a dead letter,
a block) as a record of its own; a fetched page carries its attempt's fields instead
(FetchResult v3), and the parse stage rebuilds the event from them for a page it
dead-letters. Both go through :func:`fetch_event`, so an attempt's row in ``fetch_events``
reads the same whichever stage wrote it. Pure: no client, no I/O (the parse stage must not
import the fetch stage's HTTP client).
"""

from __future__ import annotations

from typing import TypedDict

from schemas.records import CrawlJob, FetchEvent, TimestampMs


class VersionFields(TypedDict):
    """The version tuple's fields, as pages (FetchResult v2) and events carry them."""

    profile_bundle_version: str
    http_version: str
    tls_version: str
    code_revision: str


class AttemptFields(TypedDict):
    """An attempt's telemetry as a fetched record carries it (FetchResult v3)."""

    outcome: str
    reason: str
    attempt_ms: int
    fetcher_version: str


def fetch_event(job: CrawlJob, target: str, profile: str, status: int,
                attempt: AttemptFields, size: int, worker: str, versions: VersionFields,
                ts_ms: TimestampMs, event_id: str, egress: str) -> FetchEvent:
    """The event of ``job``'s attempt (``size``: the body's bytes; ``event_id``: unique per
    attempt where the quarantine app counts it, else empty)."""
    return {"url": job["url"], "target": target, "profile": profile,
            "attempt": job["attempt"], "status": status, "outcome": attempt["outcome"],
            "reason": attempt["reason"], "elapsed_ms": attempt["attempt_ms"], "bytes": size,
            "worker": worker, "fetcher_version": attempt["fetcher_version"],
            "http_version": versions["http_version"], "tls_version": versions["tls_version"],
            "profile_bundle_version": versions["profile_bundle_version"],
            "code_revision": versions["code_revision"], "ts_ms": ts_ms,
            "event_id": event_id, "egress": egress}
