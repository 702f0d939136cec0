"""Queue depth over time: the store stage samples every stage's lag into ClickHouse.

Every ``sample_interval_s`` the store worker writes one row per (stage, input topic) into
``queue_samples``: the records the stage's group has not committed yet (lag), how many it has
consumed (the sum of its committed offsets, whose rate is the stage's throughput), the
partitions behind, and the age of the oldest record still waiting (read at the group's
committed offset of each lagging partition). "Queue depth over time" is then a query
(``infra/sql/views/queue_depth.sql``), not a screen.

Rows are keyed by the sample's time bucket, so two store workers sampling the same interval
(a ClickHouse server with several) collapse to one row per bucket.

Work that no lag shows is sampled too: the live entries of ``crawl.parked`` (as the fetch
stage's) and ``crawl.timers`` (as the retry stage's), read from the broker -- not from any
worker's gauges -- so a parked job whose owner died or dropped it still counts as queued.
Each read is a full read of a compacted topic, done once per sample when its ends moved
(:class:`infra.live_state.LiveReader`). The counts are
also the store worker's status gauges (``live_parked``, ``live_timers``,
``unsettled_partitions``), which its Prometheus endpoint exports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from core.config import Settings
from core.errors import CrawlfleetError
from infra.clickhouse import Store
from infra.lag import LagProbe
from infra.live_state import LiveReader
from infra.topics import topology_of
from schemas.stages import stage_spec, stages
from streams.status import StatusFile

#: The store worker's gauges of work the broker holds (see :meth:`QueueSampler.held_work`).
HELD_GAUGES = ("live_parked", "live_timers", "unsettled_partitions")
#: How long a stopping store worker waits for the sampler's final sample.
FINAL_SAMPLE_WAIT_S = 5.0

log = logging.getLogger("crawlfleet.sampler")

SAMPLE_COLUMNS = ("ts", "stage", "topic", "lag", "consumed", "rate_per_s", "behind",
                  "oldest_age_s", "sampler")


@dataclass(frozen=True)
class Sample:
    stage: str
    topic: str
    lag: int
    consumed: int
    behind: int
    oldest_ms: int | None  # broker timestamp of the oldest waiting record


def rates(previous: dict[tuple[str, str], tuple[float, int]],
          samples: list[Sample], now: float) -> dict[tuple[str, str], float]:
    """Records consumed per second per (stage, topic) since the previous sample (pure)."""
    out: dict[tuple[str, str], float] = {}
    for s in samples:
        before = previous.get((s.stage, s.topic))
        if before is not None and now > before[0] and s.consumed >= before[1]:
            out[(s.stage, s.topic)] = (s.consumed - before[1]) / (now - before[0])
        else:
            out[(s.stage, s.topic)] = 0.0
    return out


#: How long one sample may read the oldest waiting record of its lagging partitions.
OLDEST_WAIT_S = 2.0


def oldest_reader_conf(settings: Settings) -> dict[str, Any]:
    """The client that reads one waiting record per lagging partition."""
    return {**settings.kafka_common(), "group.id": "crawlfleet-sampler",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            # A partition whose lag is only transaction markers has no record to read: its
            # end says so at once (else the read waited out its deadline, and held a
            # stopping store worker's exit for it).
            "enable.partition.eof": True,
            # One record per partition is read: fetch little (the default prefetches up to
            # 1 MB of pages per partition).
            "max.partition.fetch.bytes": 16384, "fetch.max.bytes": 1 << 20,
            "queued.max.messages.kbytes": 1024}


def oldest_waiting(reader: Consumer, behind: dict[tuple[str, int], int], wait_s: float,
                   stopped: Callable[[], bool]) -> int | None:
    """Broker timestamp of the oldest record at ``behind``'s offsets (topic, partition →
    the group's next offset), read with ``reader`` within ``wait_s``, or until
    ``stopped()``; None if there is none (a partition's lag can be markers alone)."""
    oldest: int | None = None
    try:
        reader.assign([TopicPartition(t, p, o) for (t, p), o in behind.items()])
        todo = set(behind)
        deadline = time.monotonic() + wait_s
        while todo and time.monotonic() < deadline and not stopped():
            msg = reader.poll(0.2)
            if msg is None:
                continue
            key = (msg.topic(), msg.partition())
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    todo.discard(key)  # nothing but markers past the offset
                continue
            if key not in todo:
                continue
            todo.discard(key)
            ts = msg.timestamp()[1]
            if ts > 0 and (oldest is None or ts < oldest):
                oldest = ts
    except KafkaException as exc:
        log.warning("oldest-task read failed: %s", exc)
    finally:
        reader.unassign()
    return oldest


class QueueSampler:
    """Samples queue depth on a thread of its own and writes it through ``store``."""

    def __init__(self, settings: Settings, store: Store, worker: str,
                 status: StatusFile | None = None) -> None:
        self.s = settings
        self.store = store
        self.worker = worker
        self.status = status
        if status is not None:  # keys made now: the status is written from another thread
            for name in HELD_GAUGES:
                status.gauges.setdefault(name, 0)
        self.topo = topology_of(settings)
        self.interval = settings.sample_interval_s
        self._probe = LagProbe(settings)
        self._live = LiveReader(settings)
        self._reader: Consumer | None = None
        self._previous: dict[tuple[str, str], tuple[float, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-sampler", daemon=True)

    def start(self) -> None:
        if self.interval > 0:
            self._thread.start()

    def stop(self) -> None:
        """Stop sampling, with one last sample on the way out (taken by the sampler's own
        thread): a crawl shorter than one interval still shows its rate, and its queues'
        final state (drained, after a drained crawl) is the newest row. A stop waits at most
        ``FINAL_SAMPLE_WAIT_S`` for it (a broker that is down cannot hold the worker's exit);
        a sample still running then keeps its clients (closing them under a call could
        crash it) and ends with the process."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=FINAL_SAMPLE_WAIT_S)
        if self._thread.is_alive():
            log.warning("final queue sample still running after %.0f s: left to the exit",
                        FINAL_SAMPLE_WAIT_S)
            return
        self._probe.close()
        self._live.close()
        if self._reader is not None:
            self._reader.close()

    def _run(self) -> None:
        try:  # where every group stands now: the first sample then has a rate
            self._previous = self.baseline(time.time())
        except (CrawlfleetError, KafkaException, OSError) as exc:
            log.warning("queue baseline not taken (the first rate reads 0): %s", exc)
        while not self._stop.wait(self._delay()):
            self._sample_once(final=False)
        self._sample_once(final=True)

    def _sample_once(self, final: bool) -> None:
        try:
            self.write(self.sample() + self.held_work(), time.time(), final=final)
        except Exception as exc:  # telemetry: a lost sample never stops the store stage
            log.warning("queue sample lost (the store stage goes on): %s", exc)

    def _delay(self) -> float:
        """Until the next bucket boundary, so samples line up across workers."""
        return self.interval - (time.time() % self.interval)

    def baseline(self, now: float) -> dict[tuple[str, str], tuple[float, int]]:
        """What every group has consumed now, by (stage, topic): from committed offsets
        alone (a group that committed nothing counts 0). Not a whole :meth:`sample`: its
        end offsets are asked of the partition leaders, which, on topics a crawl made a
        moment ago, took ~3 s in some starts, and a store stopped meanwhile waited for it
        (a 200-page crawl's teardown: 0.3 s, or 2.2-2.5 s in 4 runs of 10)."""
        out: dict[tuple[str, str], tuple[float, int]] = {}
        for stage in stages():
            inputs = self.topo.inputs(stage)
            committed = self._probe.committed(self.topo.group(stage), inputs,
                                              self.topo.partitions)
            if committed is None:
                continue
            for topic in inputs:
                out[(stage, topic)] = (now, sum(max(0, o) for (t, _), o in committed.items()
                                                if t == topic))
        return out

    def sample(self) -> list[Sample]:
        out: list[Sample] = []
        for stage in stages():
            group = self.topo.group(stage)
            positions = self._probe.positions(group, self.topo.inputs(stage),
                                              self.topo.partitions)
            if positions is None:
                continue
            for topic in self.topo.inputs(stage):
                mine = {tp: v for tp, v in positions.items() if tp[0] == topic}
                behind = {tp: start for tp, (start, high) in mine.items() if high > start}
                out.append(Sample(stage, topic,
                                  lag=sum(max(0, h - s) for s, h in mine.values()),
                                  consumed=sum(s for s, _ in mine.values()),
                                  behind=len(behind), oldest_ms=self._oldest(behind)))
        return out

    def held_work(self) -> list[Sample]:
        """Live entries of the changelogs that hold work (the fetch stage's parked jobs, the
        retry stage's timers, any stage's declared work stores), as the broker holds them,
        whatever any gauge says; each store's total is the gauge ``live_<store>``."""
        out: list[Sample] = []
        unsettled = 0
        held = [(stage, self.topo.prefix + st.changelog, f"live_{st.name}")
                for stage in stages() for st in stage_spec(stage).work_stores]
        for stage, topic, gauge in held:
            live = self._live.read(topic, self.topo.partitions)
            unsettled += len(live.unsettled)
            busy = sum(1 for p, n in live.counts.items() if n or p in live.unsettled)
            out.append(Sample(stage, topic, lag=live.total, consumed=0, behind=busy,
                              oldest_ms=None))
            if self.status is not None:
                self.status.gauges[gauge] = live.total
        if self.status is not None:
            self.status.gauges["unsettled_partitions"] = unsettled
        return out

    def _oldest(self, behind: dict[tuple[str, int], int]) -> int | None:
        """Broker timestamp of the oldest record waiting at the given committed offsets."""
        if not behind:
            return None
        if self._reader is None:
            self._reader = Consumer(oldest_reader_conf(self.s))
        return oldest_waiting(self._reader, behind, OLDEST_WAIT_S, self._stop.is_set)

    def write(self, samples: list[Sample], now: float, final: bool = False) -> None:
        """One row per sample at its interval's bucket; ``final`` rows at ``now`` itself (a
        bucket of their own: the bucket's earlier sample is not replaced by a partial one)."""
        if not samples:
            return
        bucket = now if final or self.interval <= 0 else now - (now % self.interval)
        per_s = rates(self._previous, samples, now)
        self._previous = {(s.stage, s.topic): (now, s.consumed) for s in samples}
        ts = datetime.fromtimestamp(bucket, UTC)
        rows: list[Sequence[Any]] = [
            (ts, s.stage, s.topic, s.lag, s.consumed, round(per_s[(s.stage, s.topic)], 3),
             s.behind, round(max(0.0, now - s.oldest_ms / 1000.0), 3)
             if s.oldest_ms is not None else 0.0, self.worker)
            for s in samples]
        token = f"queue_samples|final|{self.worker}|{now:.3f}" if final else \
            f"queue_samples|{bucket:.0f}"
        self.store.insert("queue_samples", SAMPLE_COLUMNS, rows, token)
