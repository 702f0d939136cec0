"""Retry scheduler: a keyed timer store (due time -> job) fed by the ``crawl.retry.<delay>`` tiers.

Each tier record is due at its LogAppendTime plus the job's own ``delay_ms`` (the tier's
delay if it has none: :func:`consumers.timers.due_ms`). A record already due goes straight
back to the frontier; any other becomes a timer: a record on the compacted ``crawl.timers``
changelog (same partition number as its tier partition: every target topic is
co-partitioned), keyed so keys sort by due time (:mod:`consumers.timers`), committed in the
transaction that commits the tier offset. The local store (:class:`StateStore`, one RocksDB
per owned partition) gets the timer only after that commit. Between polls the stage fires
what is due: each due job to the frontier and a tombstone for its timer, in one transaction
(with the batch's inputs, if any); the deletions reach the store after it commits. So a job
due in 2 s is never behind one due in an hour, whatever their tier.

Time is the broker's, never this worker's wall clock: :class:`BrokerClock` bounds broker-now
from below by every broker timestamp seen (tier records, timers read in restore, and the
delivery report of a tiny probe write while timers wait), so a timer can fire late, never
early.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from consumers import timers
from core.errors import DecodeError
from schemas.lineage import RELEASED, lineage_event
from schemas.records import CrawlJob
from schemas.topics import HEADER_SCHEMA, RETRY_DELAYS_S
from streams.batch_stage import BatchStage
from streams.broker_time import BrokerTimeProbe
from streams.io import Output, offset_of, tp_of
from streams.partition_restore import RestoreSpec
from streams.restorer import Restored
from streams.state_store import META, StateStore, store_dir

log = logging.getLogger("crawlfleet.retry")

#: Due jobs fired per transaction (each is a frontier record plus a tombstone).
FIRE_BATCH = 1000
#: While timers wait, refresh the broker-time bound this often with a probe write.
PROBE_EVERY_S = 30.0
#: A partition whose store could not be restored is retried this often (kept paused).
RESTORE_RETRY_S = 10.0
#: Key of the probe record: a tombstone under the store's reserved prefix, which restores skip.
PROBE_KEY = META + b"clock-probe"

Change = tuple[bytes, bytes | None]


class RetryStage(BatchStage):
    stage = "retry"
    #: The timer store, one per partition: every tier's partition N waits, paused, for the
    #: timers of N (the runtime restores them on assign, then resumes the tiers).
    state_restore = RestoreSpec(
        "timers", RESTORE_RETRY_S, log=log.name, restored="timers of partitions",
        failed="timer store of partitions",
        then=f"their tiers stay paused, retried every {RESTORE_RETRY_S:.0f} s")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tiers = {self.topology.retry(d): (i, d * 1000) for i, d in enumerate(RETRY_DELAYS_S)}
        self.changelogs = frozenset({self.topology.timers})
        self.clock = timers.BrokerClock()
        self.store = StateStore("timers", store_dir(self.settings, "timers", self.worker))
        self._counts: dict[int, int] = {}  # live timers per usable partition
        self._pending: dict[int, list[Change]] = defaultdict(list)  # uncommitted changes
        self._probe = BrokerTimeProbe(
            self.settings, f"{self.worker}-clock",
            lambda ts: self.clock.observe(ts, time.monotonic_ns()), "retry clock probe", log)
        self._probed_at: float | None = None
        self._create_time: set[tuple[str, int]] = set()  # tier partitions warned about

    def run(self) -> None:
        try:
            super().run()  # its restores end first: they write to the store
        finally:
            self.store.close()
            self._probe.close()

    # --- inputs ---------------------------------------------------------------------------

    def handle(self, msg: Message) -> list[Output]:
        job = self.encoder.decode_job(msg)
        topic, part = tp_of(msg)
        tier, tier_delay_ms = self._tiers[topic]
        ts_type, ts = msg.timestamp()
        if ts_type == TIMESTAMP_LOG_APPEND_TIME:
            self.clock.observe(ts, time.monotonic_ns())
        elif (topic, part) not in self._create_time:
            # A producer's clock must not move the estimate (it could make timers early).
            self._create_time.add((topic, part))
            log.warning("%s p%d has no LogAppendTime; its delays run from the producer's "
                        "clock", topic, part)
        key = timers.schedule(ts, tier, tier_delay_ms, job.get("delay_ms", 0), offset_of(msg),
                              self.clock.now_ms(time.monotonic_ns()))
        if key is None:
            self.status.add("forwarded")
            return self._to_frontier(job)
        out = self.encoder.record(self.topology.timers, job["target"], key, job)
        if out.partition != part:  # a record on a partition its target does not hash to
            out = Output(out.topic, part, out.key, out.value, out.headers)
        assert out.value is not None
        self._pending[part].append((key, timers.encode_value(_fingerprint(out.headers),
                                                              out.value)))
        self.status.add("timers_set")
        return [out]

    def _to_frontier(self, job: CrawlJob) -> list[Output]:
        """The job back on the frontier, and its lineage event (released, with its reason)."""
        topic = self.topology.frontier_high if job.get("priority", 0) > 0 \
            else self.topology.frontier
        return [self.encoder.job(topic, {**job, "delay_ms": 0}),
                lineage_event(self.encoder, job, RELEASED, "retry", job.get("last_error") or "")]

    # --- firing ---------------------------------------------------------------------------

    def own_outputs(self) -> list[Output]:
        """Due timers of the usable partitions: each job to the frontier, its key tombstoned."""
        if any(self._counts.values()) and self._probe_due():
            self._probe_clock()
        now = self.clock.now_ms(time.monotonic_ns())
        if now is None:
            return []
        fenced = {p for _, p in self._committed}  # the commit can carry their offsets
        out: list[Output] = []
        lineage: list[Output] = []
        for part in sorted(self._counts):
            if len(out) >= 2 * FIRE_BATCH:
                break
            if part not in fenced or not self._counts[part]:
                continue
            for key, raw in self._due(part, now, FIRE_BATCH - len(out) // 2):
                fired = self._fired(key, raw)
                out.append(fired[0])
                lineage += fired[1:]
                out.append(Output(self.topology.timers, part, key, None, []))
                self._pending[part].append((key, None))
        if out:
            self.status.add("fired", len(out) // 2)
        return out + lineage

    def _due(self, part: int, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """The partition's leading timers due at ``now_ms`` (at most ``limit``)."""
        got: list[tuple[bytes, bytes]] = []
        start: bytes | None = None
        while len(got) < limit:
            page = self.store.scan(part, limit=min(100, limit - len(got)), start=start)
            due = timers.due_keys((k for k, _ in page), now_ms, limit - len(got))
            got.extend(page[:len(due)])
            if len(due) < len(page) or not page:
                break
            start = page[-1][0] + b"\x00"
        return got

    def _fired(self, key: bytes, raw: bytes) -> list[Output]:
        fingerprint, payload = timers.decode_value(raw)
        try:
            job = self.encoder.codec.decode_as(CrawlJob, payload,
                                               [(HEADER_SCHEMA, fingerprint)])
        except DecodeError as exc:  # restore checked it; only a schema removal gets here
            return [self.encoder.dead(None, payload, self.topology.timers, exc.reason, str(exc),
                                      1)]
        return self._to_frontier(job)

    def committed(self) -> None:
        """The transaction committed: its timer puts and deletions reach the local store."""
        for part, changes in self._pending.items():
            if part not in self._counts:
                continue  # not (or no longer) a usable partition
            delta = sum((v is not None) - (self.store.get(part, k) is not None)
                        for k, v in dict(changes).items())
            self.store.apply(part, changes)
            self._counts[part] += delta
        self._pending.clear()
        # Our committed writes are applied: a restore need not read them again.
        self.store.advance({p: o + 1 for (t, p), o in self.delivered.items()
                            if t == self.topology.timers and p in self._counts})
        self.status.gauges["timers"] = sum(self._counts.values())

    def rolled_back(self) -> None:
        self._pending.clear()  # never committed: the replay produces them again

    # --- broker time ----------------------------------------------------------------------

    def _probe_due(self) -> bool:
        return self._probed_at is None or time.monotonic() - self._probed_at >= PROBE_EVERY_S

    def _probe_clock(self) -> None:
        """Tighten the broker-time bound with the LogAppendTime of a write of our own.

        With no tier records arriving (only long timers left, or a restart whose restore
        read nothing new), the bound would otherwise rest on old observations and fire late.
        The write is a tombstone under the store's reserved prefix: restores skip it and
        compaction removes it.
        """
        self._probed_at = time.monotonic()
        self._probe.probe(self.topology.timers, min(p for p, n in self._counts.items() if n),
                          PROBE_KEY, 10.0)
        self.status.add("clock_probes")

    # --- partitions (restored and resumed by the runtime: see BatchStage.state_restore) ---

    def restore(self, parts: set[int]) -> tuple[set[int], Any]:
        """Restore thread: the timer stores of ``parts`` (their committed offsets are read
        first, as stable offsets: a former owner's last timers are on the changelog before
        we read it)."""
        for part in parts:
            self.store.drop(part)  # a leftover DB is reopened from its checkpoint
        failed = self.store.restore(self.settings, self.topology.timers, parts,
                                    self._restored_value, self.settings.restore_timeout_s)
        return failed, {p: self._count(p) for p in parts - failed}

    def restored(self, done: Restored, info: Any) -> None:
        """A restore finished: its complete partitions' timers count (and can fire)."""
        counts = info if info is not None else {}
        for part in done.complete:
            self._counts[part] = counts[part]
        self.status.gauges["timers"] = sum(self._counts.values())

    def revoked(self, parts: set[int]) -> None:
        """The partitions moved: their stores close (the files stay as a checkpoint)."""
        for part in parts:
            self.store.drop(part)
            self._counts.pop(part, None)
        self.status.gauges["timers"] = sum(self._counts.values())

    def _restored_value(self, msg: Message) -> bytes | None:
        """Changelog record -> stored bytes (None: unreadable, skipped); observes its time."""
        ts_type, ts = msg.timestamp()
        if ts_type == TIMESTAMP_LOG_APPEND_TIME:
            self.clock.observe(ts, time.monotonic_ns())
        value = msg.value()
        if value is None or isinstance(value, str):
            return None
        try:
            self.encoder.decode(msg)
            return timers.encode_value(_fingerprint(msg.headers() or []), value)
        except (DecodeError, ValueError):
            return None

    def _count(self, part: int) -> int:
        n, start = 0, None
        while True:
            page = self.store.scan(part, limit=10_000, start=start)
            n += len(page)
            if len(page) < 10_000:
                return n
            start = page[-1][0] + b"\x00"


def _fingerprint(headers: Any) -> bytes:
    for k, v in headers:
        if k == HEADER_SCHEMA:
            return v if isinstance(v, bytes) else str(v).encode()
    raise ValueError("no schema fingerprint header")
