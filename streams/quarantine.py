"""The quarantine app: faust-streaming over the fetch events, issuing quarantines.

``crawlfleet worker quarantine`` runs it. Input: ``crawl.blocks`` (the FetchEvent of each
blocked attempt, which ``crawl.telemetry`` carries too with every other attempt's;
partitioned by target, so one target's counts live in one partition and one member).
State: one faust table (``counts``, keyed by target, values the ``QuarantineCounts`` Avro
record), whose compacted changelog the topology declares with
the app id (``{prefix}crawlfleet-quarantine``) like every other topic: faust creates no
topic itself (``topic_allow_declare`` off, no leader topic). Output: a quarantine record on
``crawl.control`` (compacted by ``quarantine:SCOPE:TARGET|NAME``) and its row for the store
on ``crawl.quarantines``. The counting is :mod:`streams.quarantine_rules`.

Guarantees, and why they are enough:

- at least once, concurrency 1 (faust's exactly-once and concurrency > 1 have open bugs):
  a crash replays events after the last committed offset; the table's changelog may already
  hold them, and their ids are not counted again; a quarantine issued again is the same
  record (same key, same ``at``/``until`` from the triggering event's time), so compaction
  and the store's ReplacingMergeTree keep one;
- the approved set (:mod:`streams.approval`), as for every stage: a build whose version
  tuple is not approved neither consumes fetch events nor publishes quarantines. It waits,
  joined to no group, until approved; a revocation reaching a running app holds the event
  in hand unhandled and unacknowledged (its publication not sent), stops the faust app
  (its group left), and the process starts afresh (:func:`restart_process`), waiting for
  approval;
- read_committed: faust's aiokafka consumer reads uncommitted records unless the app runs
  its own transactions (``_create_worker_consumer``); fetch events of an aborted fetch
  transaction never happened (the attempt is redone), so :class:`ReadCommittedTransport`
  makes the consumer read committed records only.

faust is imported here only, so only the quarantine process pays for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from datetime import datetime
from typing import Any, NoReturn

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from core.config import Settings
from core.errors import DecodeError
from schemas.codec import default_codec
from schemas.pipeline import QUARANTINE_TABLE
from schemas.records import FetchEvent, QuarantineCounts, QuarantineEvent
from schemas.topics import HEADER_SCHEMA, Topology
from streams.approval import ApprovalGate
from streams.control import quarantine_key
from streams.io import Encoder, Output
from streams.quarantine_rules import Block, Issued, Rules, active, empty, is_empty, observe
from streams.status import StatusFile
from streams.worker import StopFlag

log = logging.getLogger("crawlfleet.quarantine")

#: Avro single-object encoding's marker, then the writer schema's fingerprint (8 bytes):
#: a table value carries its schema itself (faust's changelog records carry no headers).
_MAGIC = b"\xc3\x01"
#: How often the status file (and the active-quarantine gauge) is written.
STATUS_EVERY_S = 1.0


def restart_process(why: str) -> NoReturn:
    """Replace this process by a fresh run of the same command (same pid, same arguments):
    faust runs one app per process (a second app built in the same interpreter fails its
    table recovery), and a revoked app must end while its process stays up, waiting for
    approval, with no supervisor needed and no crash loop."""
    log.error("%s", why)
    logging.shutdown()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])  # noqa: S606


def rules_of(s: Settings) -> Rules:
    return Rules(s.quarantine_blocks, int(s.quarantine_window_s * 1000),
                 int(s.quarantine_s * 1000), s.quarantine_target_share)


def encode_counts(state: QuarantineCounts) -> bytes:
    payload, headers = default_codec().encode("QuarantineCounts", state)
    fp = headers[0][1]
    assert isinstance(fp, bytes)
    return _MAGIC + bytes.fromhex(fp.decode()) + payload


def decode_counts(raw: bytes) -> QuarantineCounts:
    if raw[:2] != _MAGIC or len(raw) < 10:
        raise DecodeError("quarantine table value: not single-object encoded")
    headers: list[tuple[str, str | bytes | None]] = [(HEADER_SCHEMA, raw[2:10].hex())]
    return default_codec().decode_as(QuarantineCounts, raw[10:], headers)


def _ms(v: int | datetime) -> int:
    return int(v.timestamp() * 1000) if isinstance(v, datetime) else int(v)


class ReadCommittedThread(faust_aiokafka.AIOKafkaConsumerThread):
    """The aiokafka consumer faust builds, reading committed records only."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # faust passes read_committed only when the app itself runs transactions; the
        # level is read when the consumer starts (its Fetcher), which is after this.
        consumer._isolation_level = "read_committed"
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ReadCommittedThread:
        return ReadCommittedThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer


class QuarantineApp(faust.App):
    """A faust app whose consumer reads committed records only."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)


class QuarantineWorker:
    """The quarantine stage's worker: ``QuarantineWorker(settings, worker_id, stop).run()``."""

    stage = "quarantine"

    def __init__(self, settings: Settings, worker_id: str | None = None,
                 stop: StopFlag | None = None) -> None:
        self.s = settings
        self.topology = Topology(settings.topic_prefix, settings.topic_partitions,
                                 settings.replication)
        self.worker = worker_id or f"quarantine-{id(self)}"
        self.stop = stop or StopFlag()
        self.status = StatusFile(settings.status_dir, self.stage, self.worker)
        self.rules = rules_of(settings)
        self.app_id = self.topology.quarantine_app
        self.issued_by = f"{self.app_id}/{self.worker}"
        self.encoder = Encoder.of_stage(self.topology, self.stage, self.issued_by)
        self.codec = self.encoder.codec
        self._allowed: dict[str, tuple[str, ...]] = {}
        #: Each profile's egress pool: whom a block is blamed on (quarantine_rules).
        self._pools = {n: p.egress for n, p in self.s.profile_table.items()}
        self.gate = ApprovalGate(settings, self.topology.control, self.codec, self.status,
                                 f"quarantine {self.worker}")
        #: Set when a revocation reached the agent: the running app is to stop.
        self._revoked = False
        self.app, self.table = self._build()

    def _build(self) -> tuple[Any, Any]:
        s, topo = self.s, self.topology
        datadir = s.data_dir / "quarantine" / (s.topic_prefix.rstrip(".") or "default") \
            / self.worker
        datadir.mkdir(parents=True, exist_ok=True)
        app = QuarantineApp(
            self.app_id,
            broker=[f"kafka://{h.strip()}" for h in s.bootstrap_servers.split(",")],
            store="memory://",  # small (bounded by the window): rebuilt from its changelog
            datadir=str(datadir),
            processing_guarantee="at_least_once",
            topic_allow_declare=False, topic_disable_leader=True,
            topic_partitions=topo.partitions, topic_replication_factor=topo.replication,
            consumer_auto_offset_reset="earliest",
            broker_client_id=self.worker,
            broker_commit_interval=1.0,
            stream_recovery_delay=0.0,
            web_enabled=False, autodiscover=False,
        )
        raw: Any = faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw",
                           value_serializer="raw")
        # key_type/value_type bytes: faust picks the changelog's serializers from these
        # alone when it restores the table (else JSON, which fails on our keys and stalls
        # the recovery of every partition: seen after a clean stop and restart).
        table: Any = app.Table(QUARANTINE_TABLE, default=None, partitions=topo.partitions,
                               schema=raw, key_type=bytes, value_type=bytes)
        assert table.changelog_topic_name == topo.quarantine_changelog, \
            table.changelog_topic_name
        source = app.topic(topo.blocks, key_type=bytes, value_type=bytes,
                           key_serializer="raw", value_serializer="raw",
                           partitions=topo.partitions)

        async def count(stream: Any) -> None:
            async for event in stream.events():
                if self.gate.refused() is not None:
                    # Revoked: this event stays unhandled and unacknowledged (the next
                    # approved app reads it again); the main loop stops the app.
                    self._revoked = True
                    await asyncio.Event().wait()
                for out in self.handle(event.message.value, event.message.headers):
                    headers = [(k, v) for k, v in out.headers if isinstance(v, bytes)]
                    await app.producer.send_and_wait(out.topic, out.key, out.value,
                                                     out.partition, None, headers)

        app.agent(source, name="count", concurrency=1)(count)
        return app, table

    # --- one event ---------------------------------------------------------------------

    def handle(self, value: bytes | None, headers: Any) -> list[Output]:
        """Fold one telemetry record into its target's state (inside the agent, so the
        table's changelog goes to the event's partition); the records to publish."""
        self.status.add("events")
        try:
            event = self.codec.decode_as(FetchEvent, value, list(headers or ()))
        except DecodeError:
            self.status.add("undecodable")  # the store stage dead-letters it
            return []
        if event["outcome"] != "blocked":
            return []
        self.status.add("blocks")
        target = event["target"]
        key = target.encode()
        raw = self.table.get(key)
        state = decode_counts(raw) if raw is not None else empty(target)
        # v1 events (no id) are identified by what they carry: still distinct per attempt.
        eid = event["event_id"] or f"{event['worker']}|{event['url']}|{event['attempt']}" \
            f"|{_ms(event['ts_ms'])}"
        block = Block(eid, target, event["profile"], event["egress"], _ms(event["ts_ms"]))
        issued = observe(state, block, self.rules, self._allowed_for(target), self._pools)
        if is_empty(state):
            if raw is not None:
                del self.table[key]
        else:
            self.table[key] = encode_counts(state)
        return [o for i in issued for o in self._records(i)]

    def _allowed_for(self, target: str) -> tuple[str, ...]:
        got = self._allowed.get(target)
        if got is None:
            got = tuple(sorted(p.name for p in self.s.profile_table.values()
                               if p.allowed_for(target)))
            if len(self._allowed) >= 10_000:
                self._allowed.clear()
            self._allowed[target] = got
        return got

    def _records(self, i: Issued) -> list[Output]:
        q = i.quarantine
        self.status.add(f"quarantines_{q.scope}")
        if i.second_order:
            self.status.add("second_order")
        log.warning("quarantine %s %s|%s until %s%s: %s", q.scope, q.target, q.name,
                    q.until_ms, " (second order)" if i.second_order else "", q.reason)
        row: QuarantineEvent = {
            "scope": q.scope, "target": q.target, "name": q.name, "reason": q.reason,
            "at_ms": i.at_ms, "until_ms": q.until_ms, "second_order": i.second_order,
            "blocks": i.blocks, "event_id": i.event_id, "app": self.issued_by}
        key = quarantine_key(q.scope, q.target, q.name)
        return [self.encoder.control(key, q.record(self.issued_by)),
                self.encoder.record(self.topology.quarantines, q.target, key.encode(), row)]

    # --- life --------------------------------------------------------------------------

    def active_quarantines(self) -> int:
        now = int(time.time() * 1000)
        n = 0
        for raw in list(self.table.values()):
            try:
                n += active(decode_counts(raw), now)
            except DecodeError:
                continue
        return n

    def run(self) -> None:
        self.status.write(force=True)
        revoked = False
        try:
            if self.gate.wait_approved(self.stop):
                asyncio.run(self._main())
                revoked = self._revoked and not self.stop.requested
        finally:
            self.gate.close()
            self.status.remove()
        if revoked:
            restart_process(f"quarantine {self.worker}: version tuple {self.gate.mine} "
                            "revoked: the app stopped; restarting to wait for approval")

    async def _main(self) -> None:
        await self.app.start()
        try:
            last = 0.0
            while not self.stop.requested and not self.app.should_stop:
                await asyncio.sleep(0.2)
                if self._revoked or self.gate.refused() is not None:
                    self._revoked = True
                    break
                now = time.monotonic()
                if now - last >= STATUS_EVERY_S:
                    last = now
                    self.status.gauges["active_quarantines"] = self.active_quarantines()
                    self.status.assignment = sorted(
                        (tp.topic, tp.partition) for tp in self.app.consumer.assignment())
                    # Readiness: joined (a rebalance done), its table recovered.
                    self.status.rebalances = self.app.rebalancing_count
                    self.status.gauges["recovering"] = int(
                        bool(self.app.rebalancing or self.app.tables.recovery.in_recovery))
                    self.status.write(force=True)
        finally:
            await self.app.stop()
