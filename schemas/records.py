"""Typed views of the Avro records, one TypedDict per record type of the topology.

TypedDicts, not classes: values stay the plain dicts fastavro reads and writes, so the codec
and every stage keep working while mypy checks their keys. Each matches the newest schema of
its record (the codec always reads into the newest), which ``tests/unit/test_records.py``
checks field by field. A ``timestamp-millis`` field is written as epoch milliseconds but
read back by fastavro as an aware ``datetime``, hence :data:`TimestampMs`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypedDict

#: A timestamp-millis field: epoch ms when built, an aware UTC datetime when decoded.
TimestampMs = int | datetime
#: Symbols of the Seen record's enum.
SeenState = Literal["DONE", "RETRYING", "DEAD"]


class CrawlJob(TypedDict):
    url: str
    target: str
    profile: str
    depth: int
    attempt: int
    parent_url: str | None
    last_error: str | None
    priority: int
    meta: dict[str, str]
    delay_ms: int
    #: v3: only ever sent as ``profile``; False = placeable, deduped without the profile.
    pinned: bool
    #: v4: ``page`` (fetch, parse, store) or ``sitemap`` (fetch, publish the URLs it lists).
    kind: str
    #: v4: 0 for a page's first visit, n for its n-th revisit (part of the dedupe key).
    visit: int
    #: v4: the last visit's ``etag``, ``last_modified`` and ``signature`` (a revisit's).
    validators: dict[str, str]


class ExchangeFields(TypedDict):
    """FetchResult v5's part, as consumers.fetch.exchange builds it: the exchange as a WARC
    record needs it (issue 45.5), the status line and the headers as received, the request
    as sent ([name, value] pairs; secrets redacted)."""

    status_line: str
    response_headers: list[list[str]]
    request_method: str
    request_url: str
    request_headers: list[list[str]]


class CaptureFields(ExchangeFields):
    """ParsedPage v7's part, as consumers.warc.capture builds it: what the store's WARC sink
    writes (the exchange; the body zlib-compressed and its payload digest, both only with
    ``warc_dir`` set; the last stored capture a revisit record refers to)."""

    body_z: bytes
    payload_digest: str
    last_capture: dict[str, str]


class FetchResult(TypedDict):
    job: CrawlJob
    final_url: str
    status: int
    content_type: str
    body: bytes
    fetched_at_ms: TimestampMs
    elapsed_ms: int
    redirects: list[str]
    worker: str
    #: v2: the version tuple of the worker that fetched it (see core.versions).
    profile_bundle_version: str
    http_version: str
    tls_version: str
    code_revision: str
    #: v3: the attempt's telemetry, carried instead of a crawl.telemetry record (empty
    #: ``outcome``: a v2 record, whose event was written on its own).
    outcome: str
    reason: str
    attempt_ms: int
    fetcher_version: str
    #: v4: the answer's ``etag`` and ``last_modified``, for the page's next visit.
    validators: dict[str, str]
    #: v5: the exchange as a WARC record needs it (issue 45.5): the status line and the
    #: headers as received, the request as sent ([name, value] pairs; secrets redacted).
    status_line: str
    response_headers: list[list[str]]
    request_method: str
    request_url: str
    request_headers: list[list[str]]


class EnqueuedLink(TypedDict):
    """A link a page put on the frontier (ParsedPage v4): its lineage ``enqueued`` step."""

    url: str
    target: str
    dedupe_key: str


class ParsedPage(TypedDict):
    dedupe_key: str
    url: str
    final_url: str
    target: str
    profile: str
    depth: int
    status: int
    content_type: str
    title: str
    text: str
    links: list[str]
    body_bytes: int
    fetched_at_ms: TimestampMs
    fetch_worker: str
    parse_worker: str
    parsed_at_ms: TimestampMs
    #: v3: the version tuple of the worker that fetched the page.
    profile_bundle_version: str
    http_version: str
    tls_version: str
    code_revision: str
    #: v4: the links this page put on the frontier, whose ``enqueued`` lineage rows the
    #: store writes from the page (one record fewer per link), and the parser's version.
    enqueued: list[EnqueuedLink]
    parse_version: str
    #: v4: its fetch attempt's telemetry (FetchResult v3), for the store's fetch_events row
    #: (empty ``outcome``: the attempt's event is a crawl.telemetry record of its own).
    attempt: int
    outcome: str
    reason: str
    attempt_ms: int
    fetcher_version: str
    #: v5: the visit (issue 45): its number, whether the content changed since the last
    #: one, its text signature, what the next visit sends, and what its job keeps.
    visit: int
    changed: bool
    signature: str
    validators: dict[str, str]
    pinned: bool
    priority: int
    meta: dict[str, str]
    #: v6: the egress its attempt went through, for the fetch_events row (issue 41).
    egress: str
    #: v7: what the store's WARC sink writes (issue 45.5): the exchange (FetchResult v5),
    #: the body zlib-compressed and its payload digest (both only with ``warc_dir`` set),
    #: and the last stored capture a revisit record refers to (``consumers.warc.refs``).
    status_line: str
    response_headers: list[list[str]]
    request_method: str
    request_url: str
    request_headers: list[list[str]]
    body_z: bytes
    payload_digest: str
    last_capture: dict[str, str]
    #: v8: milliseconds from ``parsed_at_ms`` to the page's next visit (the interval its
    #: revisit job waits; 0: none), for page_visits' ``next_due_at`` (issue 45.3).
    next_visit_ms: int


class DeadLetter(TypedDict):
    job: CrawlJob | None
    raw: bytes | None
    source_topic: str
    reason: str
    error: str
    attempts: int
    worker: str
    version: str
    failed_at_ms: TimestampMs


class Seen(TypedDict):
    state: SeenState
    attempt: int
    status: int


class Control(TypedDict):
    kind: str
    target: str | None
    value: float | None
    text: str | None
    issued_by: str


class FetchEvent(TypedDict):
    url: str
    target: str
    profile: str
    attempt: int
    status: int
    outcome: str
    reason: str
    elapsed_ms: int
    bytes: int
    worker: str
    fetcher_version: str
    http_version: str
    tls_version: str
    profile_bundle_version: str
    code_revision: str
    ts_ms: TimestampMs
    #: v2: the attempt's own id (the quarantine app counts distinct ids) and its egress.
    event_id: str
    egress: str


class LineageEvent(TypedDict):
    dedupe_key: str
    url: str
    target: str
    profile: str
    state: str
    attempt: int
    parent_url: str | None
    detail: str
    stage: str
    worker: str
    version: str
    ts_ms: TimestampMs


class QuarantineEvent(TypedDict):
    """One quarantine the quarantine app issued (``crawl.quarantines``)."""

    scope: str
    target: str
    name: str
    reason: str
    at_ms: TimestampMs
    until_ms: TimestampMs
    second_order: bool
    blocks: int
    event_id: str
    app: str


class QuarantineCounts(TypedDict):
    """The quarantine app's state of one target (its table's changelog value)."""

    target: str
    windows: dict[str, dict[str, int]]
    since: dict[str, int]
    quarantines: dict[str, list[int]]


#: Every record type by its Avro name (as the topology names them).
RECORDS: dict[str, type] = {c.__name__: c for c in (
    CrawlJob, FetchResult, ParsedPage, DeadLetter, Seen, Control, FetchEvent, LineageEvent,
    QuarantineEvent, QuarantineCounts)}
