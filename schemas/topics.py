"""The topology of one crawl namespace: topic names, partitioning, cleanup, groups, headers.

What topics and stages exist is declared in :mod:`schemas.stages` (the pipeline's own in
:mod:`schemas.pipeline`); this module turns the declarations into the names and topic specs
of one crawl (its ``prefix``, partition count and replication).

Every target-partitioned topic has the same partition count, and records go to the
partition chosen from their target alone, so a target's frontier, results and dedupe state
(``crawl.seen``) are co-partitioned: one consumer owns all of a target's work at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from schemas.pipeline import QUARANTINE_TABLE, RETRY_DELAYS_S
from schemas.stages import DAY_MS, declared_topics, generation, stage_spec

HEADER_SCHEMA = "cf-schema"  # writer-schema fingerprint (hex CRC-64-AVRO)
HEADER_TARGET = "cf-target"

@dataclass(frozen=True)
class TopicSpec:
    name: str
    record: str  # Avro record name carried as value
    by_target: bool  # partition chosen from the target (else fixed partitions)
    partitions: int
    replication: int
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Topology:
    """Names of every topic and group of one crawl namespace (``prefix``)."""

    prefix: str = ""
    partitions: int = 12
    replication: int = 1
    seen_retention_ms: int = 7 * DAY_MS

    @property
    def frontier(self) -> str:
        return f"{self.prefix}crawl.frontier"

    @property
    def frontier_high(self) -> str:
        return f"{self.prefix}crawl.frontier.high"

    @property
    def fetched(self) -> str:
        return f"{self.prefix}crawl.fetched"

    @property
    def parsed(self) -> str:
        return f"{self.prefix}crawl.parsed"

    @property
    def dead(self) -> str:
        return f"{self.prefix}crawl.dead"

    @property
    def seen(self) -> str:
        return f"{self.prefix}crawl.seen"

    @property
    def parked(self) -> str:
        """Changelog of the fetch stage's parked per-target queues (work beyond a share)."""
        return f"{self.prefix}crawl.parked"

    @property
    def timers(self) -> str:
        """Changelog of the retry stage's timer store (delayed jobs keyed by due time)."""
        return f"{self.prefix}crawl.timers"

    @property
    def revisits(self) -> str:
        """A page's next visit, held by the revisit stage until due."""
        return f"{self.prefix}crawl.revisits"

    @property
    def control(self) -> str:
        return f"{self.prefix}crawl.control"

    @property
    def telemetry(self) -> str:
        return f"{self.prefix}crawl.telemetry"

    @property
    def blocks(self) -> str:
        """The telemetry events of blocked attempts again, for the quarantine app: it reads
        these instead of every attempt's (its cost was a tenth of a crawl's CPU)."""
        return f"{self.prefix}crawl.blocks"

    @property
    def quarantines(self) -> str:
        """Every quarantine the quarantine app issued, for the store (``quarantines``)."""
        return f"{self.prefix}crawl.quarantines"

    @property
    def quarantine_app(self) -> str:
        """The quarantine app's faust id, which is also its consumer group."""
        return self.group("quarantine")

    @property
    def quarantine_changelog(self) -> str:
        """Changelog of the quarantine app's table, as faust names it."""
        return f"{self.quarantine_app}-{QUARANTINE_TABLE}-changelog"

    @property
    def lineage(self) -> str:
        """Job state changes no other topic shows (enqueued, duplicate, parked, released)."""
        return f"{self.prefix}crawl.lineage"

    def retry(self, delay_s: int) -> str:
        return f"{self.prefix}crawl.retry.{delay_s}s"

    @property
    def retry_topics(self) -> list[str]:
        return [self.retry(d) for d in RETRY_DELAYS_S]

    def group(self, stage: str) -> str:
        return f"{self.prefix}crawlfleet-{stage}"

    def inputs(self, stage: str) -> list[str]:
        """The topics ``stage``'s consumer group reads (its queue depth is its lag on them)."""
        return [self.prefix + t for t in stage_spec(stage).inputs]

    def subscription(self, stage: str) -> list[str]:
        """The topics ``stage``'s group subscribes to: its inputs minus the followers.

        A stage that must own partition N of several topics together (fetch: both frontier
        tiers, which share a target's cap and dedupe state; retry: every delay tier, which
        share one timer store) subscribes to the first only and assigns the others' partition
        N itself (:meth:`followers`). An assignor then cannot split them, whichever it is:
        ``cooperative-sticky`` balances each topic on its own.
        """
        inputs = self.inputs(stage)
        return inputs[:1] if self.followers(stage) else inputs

    def followers(self, stage: str) -> list[str]:
        """Inputs of ``stage`` whose partition N goes wherever the lead topic's N goes."""
        return [self.prefix + t for t in stage_spec(stage).followers]

    def state_topics(self, stage: str) -> list[str]:
        """Changelogs of ``stage`` that hold work (parked jobs, timers)."""
        return [self.prefix + s.changelog for s in stage_spec(stage).work_stores]

    def outputs(self, stage: str) -> list[str]:
        """The topics ``stage`` writes besides its stores' changelogs."""
        return [self.prefix + t for t in stage_spec(stage).outputs]

    def record_of(self, topic: str) -> str:
        """The Avro record a topic carries."""
        return _records(self, generation())[topic]

    def retry_tier_for(self, wait_s: float) -> int:
        """Smallest retry delay that covers ``wait_s`` (the largest if none does)."""
        for d in RETRY_DELAYS_S:
            if d >= wait_s:
                return d
        return RETRY_DELAYS_S[-1]

    def specs(self) -> list[TopicSpec]:
        """Every declared topic, with its cleanup policy and retention."""
        n, r = self.partitions, self.replication
        base = {"min.insync.replicas": "2" if r >= 3 else "1"}
        out = []
        for d in declared_topics():
            cfg = {**base, **dict(d.config)}
            if d.expiring:
                cfg["retention.ms"] = str(self.seen_retention_ms)
            out.append(TopicSpec(self.prefix + d.name, d.record, d.by_target, d.parts or n, r,
                                 cfg))
        return out

    def spec(self, name: str) -> TopicSpec:
        for s in self.specs():
            if s.name == name:
                return s
        raise KeyError(name)


@lru_cache(maxsize=64)
def _records(topology: Topology, generation: int) -> dict[str, str]:
    return {s.name: s.record for s in topology.specs()}


@lru_cache(maxsize=65536)
def partition_for(target: str, partitions: int) -> int:
    """Partition of a target: murmur2 like Kafka's Java default partitioner."""
    return (_murmur2(target.encode()) & 0x7FFFFFFF) % partitions


def _murmur2(data: bytes) -> int:
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[i * 4:i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length & 3
    tail = data[n4 * 4:]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h if h < 0x80000000 else h - 0x100000000
