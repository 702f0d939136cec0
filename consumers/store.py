"""Store stage: parsed pages, telemetry, dead letters, lineage and quarantines → ClickHouse,
idempotently.

Each batch is inserted with an ``insert_deduplication_token`` derived from the input
offset ranges, and offsets are committed only after the insert returns. A crash between
the two replays the batch: the same token is dropped by ClickHouse, and a differently cut
batch collapses in the ReplacingMergeTree (readers use FINAL views).

A parsed page carries the lineage of the links it enqueued and its fetch attempt's telemetry
(ParsedPage v4): their rows are written from it, under the page record's place.

A crawl.parsed, crawl.telemetry or crawl.lineage record the store cannot read (or whose
values its table cannot hold) becomes a dead letter in crawl.dead, like every other stage's,
before the batch's offsets are committed; its row is written when the store reads it back,
under the record's own ``topic:partition:offset``, so a replayed batch's second copy
collapses.

A store that is not available yet -- an embedded path held by a reader or by a dying
predecessor, a ClickHouse server not up -- is waited for with back-off, never a reason to
exit: the worker claims the path for its whole life first (so readers go through it from
then on), says who holds the store (log, the ``store_waiting`` gauge, its status's
``waiting`` text) and starts as soon as it can.

On a ClickHouse cluster the worker never runs DDL: it checks that the schema (applied once by
``crawlfleet schema --cluster NAME --apply``) is all there, and waits while it is not. A
server that goes away later -- unreachable, slow past ``clickhouse_timeout_s``, a replica
down so an insert's quorum cannot be met (:mod:`infra.clickhouse_errors`) -- ends the
consumer session with the batch's offsets uncommitted: the worker says ``store_waiting``
with the reason, probes the server with back-off, and rejoins to write the batch again from
the committed offsets (its token, or the ReplacingMergeTree, drops what had landed).

With ``warc_dir`` set, the batch's pages are also appended to WARC files and fsynced before
the offsets are committed; a replay cuts the files where it starts (:mod:`consumers.warc.sink`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from consumers.fetch.conditional import ETAG, LAST_MODIFIED, NOT_MODIFIED
from consumers.sampler import QueueSampler
from consumers.warc.sink import Placed, WarcSink
from core.config import Settings
from core.errors import DecodeError, InfraError
from infra.clickhouse import (
    DEAD_COLUMNS,
    EVENT_COLUMNS,
    LINEAGE_COLUMNS,
    PAGE_COLUMNS,
    VISIT_COLUMNS,
    Store,
    StoreHeldError,
    StoreOwnership,
)
from infra.clickhouse_errors import SchemaMissingError, StoreUnavailableError
from infra.cluster_durability import STORE_QUIET_S
from infra.store_query import QueryServer
from schemas.codec import default_codec
from schemas.lineage import ENQUEUED
from schemas.records import (
    CrawlJob,
    DeadLetter,
    FetchEvent,
    LineageEvent,
    ParsedPage,
    QuarantineEvent,
    TimestampMs,
)
from streams import faults
from streams.io import (
    Output,
    offset_of,
    raw_value,
    tp_of,
)
from streams.sink_stage import SinkStage
from streams.worker import (
    WAIT_FIRST_S,
    WAIT_LOG_EVERY_S,
    WAIT_MAX_S,
    StopFlag,
)

log = logging.getLogger("crawlfleet.store")


def _hint(exc: Exception) -> str:
    """What an operator can do about a held store."""
    if isinstance(exc, SchemaMissingError):
        return " (the store worker never makes a cluster's schema; it starts once it is there)"
    if not isinstance(exc, StoreHeldError) or exc.holder is None:
        return ""
    if exc.holder.role == "reader":
        return ("; it goes on as soon as that reader finishes (readers open the store only "
                "while no store worker runs)")
    return ("; a killed predecessor lets go as it exits; if that store worker is alive, "
            "only one store worker may own an embedded store: give this one another "
            "--data-dir, or use a ClickHouse server (--clickhouse)")


#: The milliseconds a DateTime64(3) column holds (ClickHouse: 1900-01-01 .. 2299-12-31).
_TS_MIN_MS, _TS_MAX_MS = -2_208_988_800_000, 10_413_791_999_999


def _ts(ms: int) -> datetime:
    """A record's epoch milliseconds as a UTC datetime; outside what the column holds (a
    forged or corrupt record) the record is refused on its own, never its batch."""
    if not _TS_MIN_MS <= ms <= _TS_MAX_MS:
        raise DecodeError(f"timestamp {ms} ms is outside what the store holds")
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def page_row(p: ParsedPage) -> tuple[Any, ...]:
    return (p["dedupe_key"], p["url"], p["final_url"], p["target"], p["profile"],
            min(p["depth"], 65535), p["status"], p["content_type"], p["title"], p["text"],
            p["links"], p["body_bytes"], _fetched_at(p["fetched_at_ms"]), p["fetch_worker"],
            p["parse_worker"], _fetched_at(p.get("parsed_at_ms", 0)),
            p.get("profile_bundle_version", ""), p.get("http_version", ""),
            p.get("tls_version", ""), p.get("code_revision", ""))


def visit_outcome(p: ParsedPage) -> str:
    """A visit's outcome: new (a first visit), changed, unchanged or not_modified (a 304)."""
    if p.get("visit", 0) == 0:
        return "new"
    if p["status"] == NOT_MODIFIED:
        return "not_modified"
    return "changed" if p.get("changed", True) else "unchanged"


def visit_row(p: ParsedPage, crawl: str) -> tuple[Any, ...]:
    """The visit's row; ``crawl`` (the topic prefix) keeps apart the visits of two crawls of
    one store, each numbered from 0."""
    v = p.get("validators") or {}
    return (p["dedupe_key"], p.get("visit", 0), p["url"], p["target"], p["profile"],
            _fetched_at(p["fetched_at_ms"]), p["status"], visit_outcome(p),
            int(p.get("changed", True)), p.get("signature", ""), v.get(ETAG, ""),
            v.get(LAST_MODIFIED, ""), next_due_at(p), crawl,
            _fetched_at(p.get("parsed_at_ms", 0)), p["parse_worker"])


#: page_visits' ``next_due_at`` of a visit with no next one (and of rows stored before it).
NO_NEXT_VISIT = datetime(1970, 1, 1, tzinfo=UTC)


def next_due_at(p: ParsedPage) -> datetime:
    """When the page's next visit is due, as the parse stage planned it: its clock when it
    parsed the visit plus the interval (ParsedPage v8's ``next_visit_ms``). The revisit
    stage counts the interval from the broker's append of the job, written in the same
    transaction a moment later, so a revisit is late here by that moment at least.
    :data:`NO_NEXT_VISIT` when there is none (an older record, policy ``once``, a failed
    visit)."""
    wait = int(p.get("next_visit_ms") or 0)
    if wait <= 0:
        return NO_NEXT_VISIT
    parsed = _fetched_at(p.get("parsed_at_ms", 0))
    return _ts((parsed - NO_NEXT_VISIT) // timedelta(milliseconds=1) + wait)


def keeps_version(p: ParsedPage) -> bool:
    """Whether the page's row goes to ``pages``: not for a 304, whose body is the last
    version's (kept there as it was)."""
    return not (p["status"] == NOT_MODIFIED and p.get("visit", 0) > 0)


def _fetched_at(v: TimestampMs) -> datetime:
    return v if isinstance(v, datetime) else _ts(int(v))


def event_row(event_id: str, e: FetchEvent) -> tuple[Any, ...]:
    return (event_id, _fetched_at(e["ts_ms"]), e["url"], e["target"], e["profile"],
            e["attempt"], e["status"], e["outcome"], e["reason"], e["elapsed_ms"], e["bytes"],
            e["worker"], e["fetcher_version"], e["http_version"], e["tls_version"],
            e["profile_bundle_version"], e["code_revision"], e.get("egress", ""))


def dead_row(event_id: str, d: DeadLetter) -> tuple[Any, ...]:
    """The whole dead letter: the raw record's every byte (hex) and its job as JSON, from
    which ``crawlfleet dlq replay`` rebuilds it."""
    job: CrawlJob | dict[str, str] = d.get("job") or {}  # an undecodable record has none
    raw = d.get("raw")
    return (event_id, _fetched_at(d["failed_at_ms"]), job.get("url", ""), job.get("target", ""),
            job.get("profile", ""), d["source_topic"], d["reason"], d["error"], d["attempts"],
            d["worker"], d["version"], raw.hex() if raw else "",
            json.dumps(job, sort_keys=True) if job else "")


def lineage_row(event_id: str, e: LineageEvent) -> tuple[Any, ...]:
    return (event_id, _fetched_at(e["ts_ms"]), e["dedupe_key"], e["url"], e["target"],
            e["profile"], e["state"], e["attempt"], e["parent_url"] or "", e["detail"],
            e["stage"], e["worker"], e["version"])


def page_event_row(event_id: str, p: ParsedPage) -> tuple[Any, ...] | None:
    """The fetch_events row of the attempt that fetched a page (ParsedPage v4 carries it;
    None from an older page, whose attempt's event came on crawl.telemetry). Its id is the
    page record's place, so a replayed batch's second copy collapses."""
    if not p.get("outcome"):
        return None
    return (f"{event_id}#attempt", _fetched_at(p["fetched_at_ms"]), p["url"], p["target"],
            p["profile"], p["attempt"], p["status"], p["outcome"], p["reason"],
            p["attempt_ms"], p["body_bytes"], p["fetch_worker"], p["fetcher_version"],
            p["http_version"], p["tls_version"], p["profile_bundle_version"],
            p["code_revision"], p.get("egress", ""))


def enqueued_rows(event_id: str, p: ParsedPage) -> list[tuple[Any, ...]]:
    """The lineage ``enqueued`` rows of the links a page put on the frontier (ParsedPage
    v4 carries them; the parse stage wrote them in the same transaction as the jobs). Each
    row's id is the page record's place and the link's index: a replay's copy collapses."""
    parsed_at = _fetched_at(p.get("parsed_at_ms", 0))
    return [(f"{event_id}#{i}", parsed_at, link["dedupe_key"], link["url"], link["target"],
             p["profile"], ENQUEUED, 0, p["url"], "link", "parse", p["parse_worker"],
             p.get("parse_version", ""))
            for i, link in enumerate(p.get("enqueued") or ())]


#: The quarantines table's columns (a row per quarantine issued, see infra/sql/schema.sql).
QUARANTINE_COLUMNS = ("target", "scope", "name", "reason", "at", "until", "second_order",
                      "blocks", "event_id", "app", "source")


def quarantine_row(source: str, q: QuarantineEvent) -> tuple[Any, ...]:
    return (q["target"], q["scope"], q["name"], q["reason"], _fetched_at(q["at_ms"]),
            _fetched_at(q["until_ms"]), 1 if q["second_order"] else 0, q["blocks"],
            q["event_id"], q["app"], source)


#: The tables' unsigned columns (UInt16/UInt32) by position, with their largest value. A
#: record that decodes yet holds a value outside one (a negative depth, say) would fail its
#: whole batch's insert, and again on every replay: it is refused on its own instead.
_UINT_MAX = {"depth": 0xFFFF, "status": 0xFFFF, "attempt": 0xFFFF, "attempts": 0xFFFF,
             "visit": 0xFFFFFFFF, "changed": 0xFF,
             "body_bytes": 0xFFFFFFFF, "elapsed_ms": 0xFFFFFFFF, "bytes": 0xFFFFFFFF,
             "blocks": 0xFFFF, "second_order": 0xFF}
_UINT_COLUMNS: dict[str, tuple[tuple[int, str, int], ...]] = {
    table: tuple((i, c, _UINT_MAX[c]) for i, c in enumerate(cols) if c in _UINT_MAX)
    for table, cols in (("pages", PAGE_COLUMNS), ("fetch_events", EVENT_COLUMNS),
                        ("dead_letters", DEAD_COLUMNS), ("lineage", LINEAGE_COLUMNS),
                        ("quarantines", QUARANTINE_COLUMNS),
                        ("page_visits", VISIT_COLUMNS))}


def fits(table: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``row`` if every unsigned column of ``table`` can hold its value, else DecodeError."""
    for i, column, top in _UINT_COLUMNS[table]:
        if not 0 <= row[i] <= top:
            raise DecodeError(f"{table}: {column} = {row[i]} is outside 0..{top}")
    return row


#: Key prefix of the dead letters the store publishes itself, then ``topic:partition:offset``
#: of the undecodable record: that is the row's event_id, as if the store had stored it.
_OWN_DEAD_KEY = b"undecodable@"

#: A held store is tried again at most this long apart: a lock test costs nothing, and the
#: worker should start the moment the holder lets go.
STORE_POLL_MAX_S = 0.5

# No new record for this long: write the batch now. Under load records arrive in bursts, one
# per upstream transaction every ~0.1-0.3 s; a shorter gap would insert each burst on its own,
# and every chDB insert costs ~12 ms plus the merges of its part (measured: 50 ms -> 150 ms cut
# the store's CPU by ~10% on the benchmark crawl, with the same tail). It also bounds how often
# a store worker inserts, which sizes a cluster's deduplication window: hence its home there.
_QUIET_S = STORE_QUIET_S


class StoreStage(SinkStage):
    stage = "store"

    def __init__(self, settings: Settings, worker_id: str | None = None,
                 stop: StopFlag | None = None) -> None:
        super().__init__(settings, worker_id, stop, default_codec())
        self.codec = self.encoder.codec
        self.store: Store  # opened by serve(), once it is available
        self._ownership = StoreOwnership(settings) if not settings.clickhouse_dsn.get() \
            else None
        self._after_failure = False  # waiting was said after a failed write, not cleared yet
        self.warc = WarcSink(Path(settings.warc_dir), settings.warc_max_bytes, self.worker) \
            if settings.warc_dir else None
        self._archive: list[Placed] = []  # the batch's pages, for the WARC sink

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.warc is not None:
                self.warc.close()
            if self._ownership is not None:
                self._ownership.release()

    def session(self) -> None:
        if self.warc is not None:  # a new session's partitions start where they committed
            self.warc.close()
        super().session()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        super()._on_revoke(consumer, partitions)
        if self.warc is not None:
            self.warc.forget([(p.topic, p.partition) for p in partitions])

    def batch_limits(self) -> tuple[int, float, float]:
        return self.s.store_batch_rows, self.s.store_batch_wait_s, _QUIET_S

    def trickle_linger_s(self) -> float:
        return self.settings.store_trickle_wait_s

    def _open(self) -> Store | None:
        """The store, once it can be had (None if stopped first): claimed for this worker's
        life, then opened, retried with back-off while anyone else holds it."""
        began = time.monotonic()
        said_at: float | None = None
        delay = WAIT_FIRST_S
        while not self.stop.requested:
            try:
                if self._ownership is not None and not self._ownership.claim():
                    holder = self._ownership.holder()
                    who = holder.describe() if holder is not None else "another store worker"
                    raise StoreHeldError(f"the store at {self.s.clickhouse_path} is owned by "
                                         f"{who}", holder, True)
                store = Store(self.s, owner=True)
                try:
                    store.ensure_schema()
                    store.warm_up()
                except Exception:
                    store.close()
                    raise
                if said_at is not None:
                    log.info("store %s: got the store after %.1f s of waiting", self.worker,
                             time.monotonic() - began)
                self.status.waiting_for("", "store_waiting")
                return store
            except (StoreHeldError, InfraError, StoreUnavailableError) as exc:
                now = time.monotonic()
                if said_at is None or now - said_at >= WAIT_LOG_EVERY_S:
                    said_at = now
                    log.warning("store %s: waiting for the store (%.0f s so far): %s%s",
                                self.worker, now - began, exc, _hint(exc))
                self.status.waiting_for(f"store: {exc}", "store_waiting", now - began)
                self.status.add("store_retries")
                # A held embedded path is tested again at once (a lock test costs nothing);
                # a server is not hammered while it is down or slow.
                most = WAIT_MAX_S if isinstance(exc, StoreUnavailableError) else STORE_POLL_MAX_S
            self.stop.wait(delay)
            delay = min(most, delay * 2)
        return None

    def _wait_for_server(self, exc: StoreUnavailableError) -> None:
        """After a write the server could not take: say so and probe it with back-off
        until it answers and the schema is there (or the worker is stopped). The session
        ended with the batch's offsets uncommitted; the next one writes it again."""
        began = time.monotonic()
        said_at: float | None = None
        delay = WAIT_FIRST_S
        while not self.stop.requested:
            now = time.monotonic()
            if said_at is None or now - said_at >= WAIT_LOG_EVERY_S:
                said_at = now
                log.warning("store %s: waiting for ClickHouse (%.0f s so far), the batch's "
                            "offsets uncommitted: %s%s", self.worker, now - began, exc,
                            _hint(exc))
            self.status.waiting_for(f"store: {exc}", "store_waiting", now - began)
            self.status.add("store_retries")
            self.stop.wait(delay)
            delay = min(WAIT_MAX_S, delay * 2)
            try:
                if self.store.cluster:
                    self.store.check_schema()
                else:
                    self.store.scalar("SELECT 1")
                self._after_failure = True  # said waiting until a write (or idle) proves it
                return
            except StoreUnavailableError as again:
                exc = again

    def serve(self) -> None:
        """The store for the worker's life; consumer sessions come and go inside it (a
        fenced consumer is made new, the store, query server and sampler stay open). Rows
        written past a failed session's commit are inserted again from the committed
        offsets, and collapse (token, ReplacingMergeTree)."""
        store = self._open()
        if store is None:
            return
        self.store = store
        server = QueryServer(self.store, self.s.clickhouse_path) if self.store.embedded else None
        if server:
            server.start()
        sampler = QueueSampler(self.s, self.store, self.worker, self.status)
        sampler.start()
        try:
            while not self.stop.requested:
                try:
                    self.rejoining()
                except StoreUnavailableError as exc:
                    self._wait_for_server(exc)
                    continue
                break
        finally:
            sampler.stop()
            if server:
                server.stop()
            self.store.close()

    def write(self, batch: list[Message]) -> dict[tuple[str, int], int]:
        rows: dict[str, list[Sequence[Any]]] = {"pages": [], "fetch_events": [],
                                                  "dead_letters": [], "lineage": [],
                                                  "quarantines": [], "page_visits": []}
        ranges: dict[tuple[str, int], list[int]] = {}
        dead: list[Output] = []
        self._archive = []
        for msg in batch:
            (topic, partition), offset = tp_of(msg), offset_of(msg)
            r = ranges.setdefault((topic, partition), [offset, offset])
            r[0], r[1] = min(r[0], offset), max(r[1], offset)
            event_id = f"{topic}:{partition}:{offset}"
            try:
                try:
                    self._route(msg, event_id, rows)
                except (KeyError, TypeError, ValueError, OverflowError) as exc:
                    # a record that decodes yet cannot be a row (nobody foresaw it): refused
                    # on its own with its class, so no record can stop the stage
                    raise DecodeError(f"unstorable record: {type(exc).__name__}: {exc}"
                                      ) from exc
            except DecodeError as exc:
                if topic == self.topology.dead:  # already in crawl.dead, as it came
                    rows["dead_letters"].append((event_id, datetime.now(UTC), "", "", "",
                                                 topic, exc.reason, str(exc), 1, self.worker,
                                                 "", (raw_value(msg) or b"").hex(), ""))
                else:
                    dead.append(self._undecodable(msg, event_id, exc))
        if dead:
            # In crawl.dead before the offsets move; the rows come when the store reads
            # them back from there, keyed by the records' own places (see _route).
            self._publish(dead)
        token = ",".join(f"{t}:{p}:{a}-{b}" for (t, p), (a, b) in sorted(ranges.items()))
        columns: dict[str, Sequence[str]] = {"pages": PAGE_COLUMNS,
                                             "fetch_events": EVENT_COLUMNS,
                                             "dead_letters": DEAD_COLUMNS,
                                             "lineage": LINEAGE_COLUMNS,
                                             "quarantines": QUARANTINE_COLUMNS,
                                             "page_visits": VISIT_COLUMNS}
        for i, (table, table_rows) in enumerate(rows.items()):
            self.store.insert(table, columns[table], table_rows, f"{table}|{token}")
            self.status.add(f"stored_{table}", len(table_rows))
            if i == 0 and faults.fails("store_unavailable"):
                raise StoreUnavailableError("fault injection: the server took the batch's "
                                            "first table, then no more")
        if self.warc is not None and self._archive:  # on disk before the offsets move
            self.status.add("warc_bytes", self.warc.write(self._archive))
            self.status.add("warc_pages", len(self._archive))
            faults.point("after_warc")
        faults.point("after_insert")
        self._store_answers()
        return {tp: b + 1 for tp, (_, b) in ranges.items()}

    def _collect(self, consumer: Consumer) -> list[Message]:
        batch = super()._collect(consumer)
        if not batch:
            self._store_answers()  # nothing left to write again: the probe's word stands
        return batch

    def _store_answers(self) -> None:
        """The store took a write (or has none to take) since the last failure: no longer
        waiting."""
        if self._after_failure:
            self._after_failure = False
            self.status.waiting_for("", "store_waiting")

    def _route(self, msg: Message, event_id: str, rows: dict[str, list[Sequence[Any]]]) -> None:
        topic = tp_of(msg)[0]
        value, headers = msg.value(), msg.headers()
        if topic == self.topology.parsed:
            page = self.codec.decode_as(ParsedPage, value, headers)
            # The attempt and the links' steps happened whatever the page holds: their rows
            # stay even if the page's own is refused (and dead-lettered) below.
            attempt = page_event_row(event_id, page)
            if attempt is not None:
                rows["fetch_events"].append(fits("fetch_events", attempt))
            rows["lineage"] += [fits("lineage", r) for r in enqueued_rows(event_id, page)]
            rows["page_visits"].append(fits("page_visits", visit_row(page, self.topology.prefix)))
            if self.warc is not None:
                self._archive.append((topic, tp_of(msg)[1], offset_of(msg), page))
            if keeps_version(page):
                rows["pages"].append(fits("pages", page_row(page)))
        elif topic == self.topology.telemetry:
            event = self.codec.decode_as(FetchEvent, value, headers)
            rows["fetch_events"].append(fits("fetch_events", event_row(event_id, event)))
        elif topic == self.topology.lineage:
            step = self.codec.decode_as(LineageEvent, value, headers)
            rows["lineage"].append(fits("lineage", lineage_row(event_id, step)))
        elif topic == self.topology.quarantines:
            q = self.codec.decode_as(QuarantineEvent, value, headers)
            rows["quarantines"].append(fits("quarantines", quarantine_row(event_id, q)))
        else:  # crawl.dead, the one other topic the store reads
            record = self.codec.decode_as(DeadLetter, value, headers)
            key = msg.key() or b""
            key = key.encode() if isinstance(key, str) else key
            if key.startswith(_OWN_DEAD_KEY):  # one of ours: its row is the record's place
                event_id = key[len(_OWN_DEAD_KEY):].decode("utf-8", "replace")
            rows["dead_letters"].append(fits("dead_letters", dead_row(event_id, record)))

    def _undecodable(self, msg: Message, event_id: str, exc: DecodeError) -> Output:
        """A dead letter for crawl.dead (the complete record of failures), keyed by where
        the record was: a replay publishes it again, and its row collapses with the first."""
        self.status.add("undecodable")
        self.status.metrics.dead_letter(exc.reason)
        return replace(self.encoder.undecodable(msg, exc),
                       key=_OWN_DEAD_KEY + event_id.encode())

    def _publish(self, dead: list[Output]) -> None:
        """In crawl.dead before the batch's offsets move (else the session ends and the
        batch is replayed)."""
        self.publish(dead)
        self.status.add("dead_published", len(dead))
