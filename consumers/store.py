"""Store stage: parsed pages, telemetry, dead letters and lineage → ClickHouse, idempotently.

Each batch is inserted with an ``insert_deduplication_token`` derived from the input
offset ranges, and offsets are committed only after the insert returns. A crash between
the two replays the batch: the same token is dropped by ClickHouse, and a differently cut
batch collapses in the ReplacingMergeTree (readers use FINAL views).

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
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from consumers.sampler import QueueSampler
from core.config import Settings
from core.errors import DecodeError, InfraError, KafkaStageError
from infra.clickhouse import (
    DEAD_COLUMNS,
    EVENT_COLUMNS,
    LINEAGE_COLUMNS,
    PAGE_COLUMNS,
    Store,
    StoreHeldError,
    StoreOwnership,
)
from infra.store_query import QueryServer
from infra.topics import topology_of
from schemas.codec import default_codec
from schemas.records import (
    CrawlJob,
    DeadLetter,
    FetchEvent,
    LineageEvent,
    ParsedPage,
    TimestampMs,
)
from streams import faults
from streams.io import (
    Encoder,
    FencedError,
    Output,
    consume_ready,
    consumer_conf,
    offset_of,
    producer_conf,
    raw_value,
    rewind,
    tp_of,
)
from streams.membership import Membership
from streams.status import PollGaps, StatusFile
from streams.worker import (
    REJOIN_PAUSE_S,
    WAIT_FIRST_S,
    WAIT_LOG_EVERY_S,
    StopFlag,
    wait_for_kafka,
    worker_name,
)

log = logging.getLogger("crawlfleet.store")


def _hint(exc: Exception) -> str:
    """What an operator can do about a held store."""
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
            p["parse_worker"], _fetched_at(p.get("parsed_at_ms", 0)))


def _fetched_at(v: TimestampMs) -> datetime:
    return v if isinstance(v, datetime) else _ts(int(v))


def event_row(event_id: str, e: FetchEvent) -> tuple[Any, ...]:
    return (event_id, _fetched_at(e["ts_ms"]), e["url"], e["target"], e["profile"],
            e["attempt"], e["status"], e["outcome"], e["reason"], e["elapsed_ms"], e["bytes"],
            e["worker"], e["fetcher_version"], e["http_version"], e["tls_version"],
            e["profile_bundle_version"], e["code_revision"])


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


#: The tables' unsigned columns (UInt16/UInt32) by position, with their largest value. A
#: record that decodes yet holds a value outside one (a negative depth, say) would fail its
#: whole batch's insert, and again on every replay: it is refused on its own instead.
_UINT_MAX = {"depth": 0xFFFF, "status": 0xFFFF, "attempt": 0xFFFF, "attempts": 0xFFFF,
             "body_bytes": 0xFFFFFFFF, "elapsed_ms": 0xFFFFFFFF, "bytes": 0xFFFFFFFF}
_UINT_COLUMNS: dict[str, tuple[tuple[int, str, int], ...]] = {
    table: tuple((i, c, _UINT_MAX[c]) for i, c in enumerate(cols) if c in _UINT_MAX)
    for table, cols in (("pages", PAGE_COLUMNS), ("fetch_events", EVENT_COLUMNS),
                        ("dead_letters", DEAD_COLUMNS), ("lineage", LINEAGE_COLUMNS))}


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
# the store's CPU by ~10% on the benchmark crawl, with the same tail).
_QUIET_S = 0.15


class StoreStage:
    stage = "store"

    def __init__(self, settings: Settings, worker_id: str | None = None,
                 stop: StopFlag | None = None) -> None:
        self.s = settings
        self.topology = topology_of(settings)
        self.worker = worker_name(self.stage, worker_id, settings.data_dir / "workers")
        self.stop = stop if stop is not None else StopFlag()
        self.codec = default_codec()
        self.status = StatusFile(settings.status_dir, self.stage, self.worker)
        self.poll_gaps = PollGaps(self.status)
        self.store: Store  # opened by run(), once it is available
        self._ownership = StoreOwnership(settings) if not settings.clickhouse_dsn.get() \
            else None
        self._committed: dict[tuple[str, int], int] = {}
        self._revoked: set[tuple[str, int]] = set()
        self._encoder = Encoder(self.topology, self.worker, self.codec)
        self._producer: Producer | None = None  # made for the first undecodable record

    def run(self) -> None:
        try:
            store = self._open()
            if store is not None:
                self.store = store
                self._serve()
        finally:
            if self._ownership is not None:
                self._ownership.release()
            self.status.remove()

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
            except (StoreHeldError, InfraError) as exc:
                now = time.monotonic()
                if said_at is None or now - said_at >= WAIT_LOG_EVERY_S:
                    said_at = now
                    log.warning("store %s: waiting for the store (%.0f s so far): %s%s",
                                self.worker, now - began, exc, _hint(exc))
                self.status.waiting_for(f"store: {exc}", "store_waiting", now - began)
            self.stop.wait(delay)
            delay = min(STORE_POLL_MAX_S, delay * 2)
        return None

    def _serve(self) -> None:
        server = QueryServer(self.store, self.s.clickhouse_path) if self.store.embedded else None
        if server:
            server.start()
        sampler = QueueSampler(self.s, self.store, self.worker, self.status)
        sampler.start()
        try:
            while not self.stop.requested:
                try:
                    self._session()
                except FencedError as exc:
                    # The consumer is over (a fatal error: fenced by a newer join of this
                    # id). Rows written past the commit are inserted again from the
                    # committed offsets, and collapse (token, ReplacingMergeTree).
                    log.warning("store %s: its consumer ended, rejoining: %s", self.worker, exc)
                    self.status.add("fenced")
                    self._committed.clear()
                    self._revoked.clear()
                    self.stop.wait(REJOIN_PAUSE_S)
                    wait_for_kafka(self.s, self.stop, self.status, f"store {self.worker}")
        finally:
            sampler.stop()
            if server:
                server.stop()
            self.store.close()

    def _session(self) -> None:
        """One consumer's life in the group: collect, insert, commit, until stopped."""
        consumer = Consumer(consumer_conf(self.s, self.topology.group("store"), self.worker))
        Membership(self.topology, self.stage).subscribe(consumer, on_revoke=self._on_revoke,
                                                         report=self.status)
        try:
            while not self.stop.requested:
                batch = self._collect(consumer)
                if self._revoked:
                    # Moved while collecting (only those partitions: rebalances are
                    # incremental): the new owner stores them, from the committed offset.
                    batch = [m for m in batch if tp_of(m) not in self._revoked]
                    owned = {(p.topic, p.partition) for p in consumer.assignment()}
                    # One revoked and assigned again: re-read it from its committed offset.
                    rewind(consumer, [TopicPartition(t, p) for t, p in self._revoked & owned])
                    self._revoked.clear()
                offsets = self._write(batch) if batch else {}
                # Stored, offsets not committed yet: rows a crash now would insert again
                # (dropped by the deduplication token only if the replay batches alike).
                self.status.gauges["uncommitted"] = self.status.gauges.get(
                    "uncommitted", 0) + len(batch)
                self._commit(consumer, offsets)
                self.status.write()
        finally:
            consumer.close()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            self._revoked.add((p.topic, p.partition))
            self._committed.pop((p.topic, p.partition), None)

    def _collect(self, consumer: Consumer) -> list[Message]:
        """Records for one insert: at most ``store_batch_rows``, gathered for at most
        ``store_batch_wait_s`` after the first one, and cut short when the input goes quiet
        (then nothing more is coming soon and waiting would only delay the results)."""
        batch: list[Message] = []
        rows = self.s.store_batch_rows
        deadline: float | None = None
        while len(batch) < rows and not self.stop.requested:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            timeout = 0.2 if deadline is None else min(deadline - now, _QUIET_S)
            got = False
            self.poll_gaps.tick()
            for msg in consume_ready(consumer, min(1000, rows - len(batch)), timeout):
                err = msg.error()
                if err is None:
                    batch.append(msg)
                    got = True
                elif err.code() != KafkaError._PARTITION_EOF:
                    log.warning("store consume error: %s", err)
            if got and deadline is None:
                deadline = now + self.s.store_batch_wait_s
            elif not got:
                if batch:
                    break
                self.status.write()
        return batch

    def _commit(self, consumer: Consumer, offsets: dict[tuple[str, int], int]) -> None:
        """Commit what was written, and positions past transaction markers when idle."""
        for pos in consumer.position(consumer.assignment()):
            key = (pos.topic, pos.partition)
            if pos.offset > offsets.get(key, -1):
                offsets[key] = pos.offset
        changed = {k: o for k, o in offsets.items() if self._committed.get(k) != o}
        if not changed:
            self.status.gauges["uncommitted"] = 0
            return
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in changed.items()],
                            asynchronous=False)
            self._committed.update(changed)
            self.status.gauges["uncommitted"] = 0
        except KafkaException as exc:  # rebalanced meanwhile: the batch will be replayed
            log.warning("store offset commit failed, batch will be replayed: %s", exc)

    def _write(self, batch: list[Message]) -> dict[tuple[str, int], int]:
        rows: dict[str, list[Sequence[Any]]] = {"pages": [], "fetch_events": [],
                                                  "dead_letters": [], "lineage": []}
        ranges: dict[tuple[str, int], list[int]] = {}
        dead: list[Output] = []
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
                                             "lineage": LINEAGE_COLUMNS}
        for table, table_rows in rows.items():
            self.store.insert(table, columns[table], table_rows, f"{table}|{token}")
            self.status.add(f"stored_{table}", len(table_rows))
        faults.point("after_insert")
        return {tp: b + 1 for tp, (_, b) in ranges.items()}

    def _route(self, msg: Message, event_id: str, rows: dict[str, list[Sequence[Any]]]) -> None:
        topic = tp_of(msg)[0]
        value, headers = msg.value(), msg.headers()
        if topic == self.topology.parsed:
            page = self.codec.decode_as(ParsedPage, value, headers)
            rows["pages"].append(fits("pages", page_row(page)))
        elif topic == self.topology.telemetry:
            event = self.codec.decode_as(FetchEvent, value, headers)
            rows["fetch_events"].append(fits("fetch_events", event_row(event_id, event)))
        elif topic == self.topology.lineage:
            step = self.codec.decode_as(LineageEvent, value, headers)
            rows["lineage"].append(fits("lineage", lineage_row(event_id, step)))
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
        return replace(self._encoder.undecodable(msg, exc),
                       key=_OWN_DEAD_KEY + event_id.encode())

    def _publish(self, dead: list[Output]) -> None:
        """Produce ``dead`` and wait until the broker has them all (else raise: the batch's
        offsets must not be committed, it is replayed)."""
        if self._producer is None:
            self._producer = Producer(producer_conf(self.s, self.worker))
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(err)

        for out in dead:
            self._producer.produce(out.topic, value=out.value, key=out.key,
                                   partition=out.partition, headers=out.headers,
                                   on_delivery=delivered)
        left = self._producer.flush(30)
        if left or failed:
            raise KafkaStageError(f"store: {left} dead letters undelivered, "
                                  f"{len(failed)} failed ({failed[:1]})")
        self.status.add("dead_published", len(dead))
