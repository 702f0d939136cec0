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


#: Every record type by its Avro name (as the topology names them).
RECORDS: dict[str, type] = {c.__name__: c for c in (
    CrawlJob, FetchResult, ParsedPage, DeadLetter, Seen, Control, FetchEvent, LineageEvent)}
