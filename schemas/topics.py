"""The topology, declared once: topic names, partitioning, cleanup, groups, headers.

Every target-partitioned topic has the same partition count, and records go to the
partition chosen from their target alone, so a target's frontier, results and dedupe state
(``crawl.seen``) are co-partitioned: one consumer owns all of a target's work at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

HEADER_SCHEMA = "cf-schema"  # writer-schema fingerprint (hex CRC-64-AVRO)
HEADER_TARGET = "cf-target"

DAY_MS = 24 * 3600 * 1000

#: Retry tiers: (delay in seconds, topic suffix). Attempt n waits in the first tier whose
#: delay is at least what the failure asked for (Retry-After or back-off).
RETRY_DELAYS_S: tuple[int, ...] = (2, 15, 120)
#: The pipeline's own consumer-group stages, in a job's order through it (stages a user
#: declares with :func:`register_stage` come after these: :func:`stages`).
STAGES: tuple[str, ...] = ("fetch", "parse", "store", "retry")
#: Analytics stages: apps that read the pipeline's records at least once and only issue
#: control records (the faust-streaming quarantine app). ``crawl`` starts them and ``top``
#: shows them, but the drain check never waits on them and chaos leaves them alone: their
#: lag is analytics, not work (:func:`analytics_stages`).
ANALYTICS: tuple[str, ...] = ("quarantine",)
#: The quarantine app's faust table (one state record per target, see
#: ``streams.quarantine_rules``); faust names its changelog ``{app id}-{table}-changelog``.
QUARANTINE_TABLE = "counts"


@dataclass(frozen=True)
class StageSpec:
    """One consumer-group stage, as the topology declares it: what it reads, where its
    worker class is, and what the operator views call its queue.

    ``inputs`` are topic names without the crawl's prefix (``crawl.parsed``); the first of
    ``followers`` (also in ``inputs``) go wherever the lead input's partition N goes.
    ``entry`` is ``"module:Class"``: ``Class(settings, worker_id, stop)`` is the worker
    (``streams.batch_stage.BatchStage`` gives one the whole runtime). ``state_topics`` are
    changelogs holding work (parked jobs, timers): a crawl is drained only when the broker
    holds no live entry in them. ``stores`` are the local state stores the stage owns, each
    rebuilt from its changelog (:func:`streams.state_store.store_dir` lays them out): a
    worker's local state can be wiped and must come back from the broker. ``label`` names
    the stage's queue in progress tables.
    """

    name: str
    inputs: tuple[str, ...]
    entry: str
    followers: tuple[str, ...] = ()
    state_topics: tuple[str, ...] = ()
    label: str = ""
    stores: tuple[str, ...] = ()
    #: At-least-once analytics (its lag is not work): see :data:`ANALYTICS`.
    analytics: bool = False


@dataclass(frozen=True)
class TopicDecl:
    """A topic a user stage adds: its name without the prefix, the Avro record it carries,
    and its config (``cleanup.policy`` and so on). Partitioned by target like the rest."""

    name: str
    record: str
    config: tuple[tuple[str, str], ...] = (("cleanup.policy", "delete"),
                                           ("retention.ms", str(7 * DAY_MS)))


_BUILTIN: dict[str, StageSpec] = {
    "fetch": StageSpec("fetch", ("crawl.frontier", "crawl.frontier.high"),
                       "consumers.fetch.stage:FetchStage", followers=("crawl.frontier.high",),
                       state_topics=("crawl.parked",), label="frontier",
                       stores=("seen", "parked")),
    "parse": StageSpec("parse", ("crawl.fetched",), "consumers.parse:ParseStage",
                       label="fetched→parse"),
    "store": StageSpec("store", ("crawl.parsed", "crawl.telemetry", "crawl.dead",
                                 "crawl.lineage", "crawl.quarantines"),
                       "consumers.store:StoreStage",
                       label="parsed→store"),
    "retry": StageSpec("retry", tuple(f"crawl.retry.{d}s" for d in RETRY_DELAYS_S),
                       "consumers.retry:RetryStage",
                       followers=tuple(f"crawl.retry.{d}s" for d in RETRY_DELAYS_S[1:]),
                       state_topics=("crawl.timers",), label="retry", stores=("timers",)),
    "quarantine": StageSpec("quarantine", ("crawl.blocks",),
                            "streams.quarantine:QuarantineWorker",
                            label="blocks→quarantine", analytics=True),
}
_REGISTERED: dict[str, StageSpec] = {}
_TOPICS: dict[str, TopicDecl] = {}


def register_stage(spec: StageSpec, topics: tuple[TopicDecl, ...] = ()) -> None:
    """Add a stage (and the topics it writes) to every topology of this process.

    A worker process learns user stages from the modules named in the ``stage_modules``
    setting (``CRAWLFLEET_STAGE_MODULES``), which call this when imported; registering the
    same declaration again is a no-op, a different one under a taken name an error.
    """
    for decl in topics:
        if _TOPICS.get(decl.name, decl) != decl:
            raise ValueError(f"topic {decl.name!r} is already declared otherwise")
        _TOPICS[decl.name] = decl
    if spec.name in _BUILTIN or _REGISTERED.get(spec.name, spec) != spec:
        raise ValueError(f"stage {spec.name!r} is already declared")
    if not spec.inputs or not set(spec.followers) <= set(spec.inputs[1:]):
        raise ValueError(f"stage {spec.name!r}: inputs must be given, followers among them")
    _REGISTERED[spec.name] = spec
    _records.cache_clear()


def unregister_stage(name: str, topics: tuple[str, ...] = ()) -> None:
    """Forget a registered stage and the named topics (a test's own stage, after it)."""
    _REGISTERED.pop(name, None)
    for topic in topics:
        _TOPICS.pop(topic, None)
    _records.cache_clear()


def declared_topics() -> tuple[TopicDecl, ...]:
    """Topics the registered stages write, in the order they were declared."""
    return tuple(_TOPICS.values())


def declared_modules() -> tuple[str, ...]:
    """Modules of the stages registered in this process (each declared where its worker
    class lives): the ``stage_modules`` a child process needs to know them too."""
    return tuple(sorted({spec.entry.partition(":")[0] for spec in _REGISTERED.values()}))


def stages() -> tuple[str, ...]:
    """Every stage of the pipeline: its own four, then those registered, in that order."""
    return (*STAGES, *_REGISTERED)


def analytics_stages() -> tuple[str, ...]:
    """The analytics stages (:data:`ANALYTICS`): run and shown, never waited on."""
    return ANALYTICS


def stage_spec(stage: str) -> StageSpec:
    spec = _BUILTIN.get(stage) or _REGISTERED.get(stage)
    if spec is None:
        raise KeyError(f"unknown stage {stage!r}; stages are {', '.join(stages())}")
    return spec


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
        return [self.prefix + t for t in stage_spec(stage).state_topics]

    def record_of(self, topic: str) -> str:
        """The Avro record a topic carries."""
        return _records(self)[topic]

    def retry_tier_for(self, wait_s: float) -> int:
        """Smallest retry delay that covers ``wait_s`` (the largest if none does)."""
        for d in RETRY_DELAYS_S:
            if d >= wait_s:
                return d
        return RETRY_DELAYS_S[-1]

    def specs(self) -> list[TopicSpec]:
        """Every topic crawlfleet uses, with its cleanup policy and retention."""
        n, r = self.partitions, self.replication
        min_isr = "2" if r >= 3 else "1"
        base = {"min.insync.replicas": min_isr}
        week = str(7 * DAY_MS)

        def t(name: str, record: str, cfg: dict[str, str], by_target: bool = True,
              parts: int | None = None) -> TopicSpec:
            return TopicSpec(name, record, by_target, parts or n, r, {**base, **cfg})

        specs = [
            t(self.frontier, "CrawlJob", {"cleanup.policy": "delete", "retention.ms": week}),
            t(self.frontier_high, "CrawlJob", {"cleanup.policy": "delete", "retention.ms": week}),
            t(self.fetched, "FetchResult", {"cleanup.policy": "delete", "retention.ms": week,
                                            "max.message.bytes": str(16 * 1024 * 1024)}),
            t(self.parsed, "ParsedPage", {"cleanup.policy": "delete", "retention.ms": week,
                                          "max.message.bytes": str(16 * 1024 * 1024)}),
            t(self.dead, "DeadLetter", {"cleanup.policy": "delete",
                                        "retention.ms": str(30 * DAY_MS)}),
            t(self.seen, "Seen", {"cleanup.policy": "compact,delete",
                                  "retention.ms": str(self.seen_retention_ms),
                                  "min.compaction.lag.ms": "60000"}),
            # Partition-owned state stores: compacted, never expired (a parked job or a
            # timer leaves only by its tombstone, written when the job moves on).
            t(self.parked, "CrawlJob", {"cleanup.policy": "compact"}),
            t(self.timers, "CrawlJob", {"cleanup.policy": "compact",
                                        "message.timestamp.type": "LogAppendTime"}),
            t(self.control, "Control", {"cleanup.policy": "compact"}, by_target=False, parts=1),
            t(self.telemetry, "FetchEvent", {"cleanup.policy": "delete", "retention.ms": week}),
            t(self.blocks, "FetchEvent", {"cleanup.policy": "delete", "retention.ms": week}),
            t(self.lineage, "LineageEvent", {"cleanup.policy": "delete", "retention.ms": week}),
            t(self.quarantines, "QuarantineEvent", {"cleanup.policy": "delete",
                                                    "retention.ms": str(30 * DAY_MS)}),
            # The quarantine app's table: one record per target, compacted (faust writes
            # each partition's entries to the blocks partition of their target).
            t(self.quarantine_changelog, "QuarantineCounts", {"cleanup.policy": "compact"}),
        ]
        # Retry tiers use the broker's clock for the record timestamp: the delay is measured
        # from when the broker appended the record, never from a worker's clock.
        specs += [t(self.retry(d), "CrawlJob", {"cleanup.policy": "delete", "retention.ms": week,
                                                 "message.timestamp.type": "LogAppendTime"})
                  for d in RETRY_DELAYS_S]
        specs += [t(self.prefix + d.name, d.record, dict(d.config)) for d in _TOPICS.values()]
        return specs

    def spec(self, name: str) -> TopicSpec:
        for s in self.specs():
            if s.name == name:
                return s
        raise KeyError(name)


@lru_cache(maxsize=64)
def _records(topology: Topology) -> dict[str, str]:
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
