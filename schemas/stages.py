"""Stage declarations and the one registry of them: what each stage reads, writes and keeps.

A stage is declared whole by a :class:`StageSpec`: its inputs, its outputs, the state stores
and timer stores it owns per partition (each with its compacted changelog), and the traits
the fleet's tooling reads (a late start, the store's owner, the stage that sends requests).
The runtime (``streams/``) opens, restores, checkpoints and closes every store and timer
store a stage names; the fleet, the capacity plan, topic provisioning, the drain check,
``top``, chaos and the deployment files all read the same registry, so a stage added here
is started, provisioned, drawn, drained and killed with no other file touched.

The pipeline's own stages are declared the way users declare theirs: ``register_stage`` in
the module that owns them (:mod:`schemas.pipeline`, imported before any question is asked
of the registry); a user's stage module calls it on import and is named in the
``stage_modules`` setting so worker processes learn it too.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

DAY_MS = 24 * 3600 * 1000
WEEK = (("cleanup.policy", "delete"), ("retention.ms", str(7 * DAY_MS)))
HOUR_MS = 3600 * 1000
#: Changelogs whose keys churn (timers fired and planned again, dedupe keys pruned or
#: expired): compaction only cleans closed segments, and the default segment.ms (7 days)
#: kept every fired timer's old values and tombstones that long. An hour's segments let the
#: cleaner reclaim them within hours. A tombstone then outlives its cleaning by
#: delete.retention.ms (stated, the broker's default day): a restore that started before the
#: cleaning must still read it, and a restore is bounded by ``restore_timeout_s`` (minutes).
#: A worker's local store checkpointed before a tombstone and resumed more than that day
#: later could miss it (the caveat of every checkpointed changelog store).
CHURNING = (("segment.ms", str(HOUR_MS)), ("delete.retention.ms", str(DAY_MS)))


@dataclass(frozen=True)
class TopicDecl:
    """A topic of the pipeline: its name without the crawl's prefix, the Avro record it
    carries, its config (``cleanup.policy`` and so on), and whether its partition is chosen
    from the record's target (every target topic is co-partitioned) or fixed (``parts``).
    ``expiring``: its retention is the topology's TTL retention (``Topology.seen_retention_ms``:
    longer than the retry horizon plus the longest lease, set from the settings).
    ``fed_by`` names who writes it from outside the stages (``publish``: the users'
    frontier publishers; ``operator``: the control commands), for the graph."""

    name: str
    record: str
    config: tuple[tuple[str, str], ...] = WEEK
    by_target: bool = True
    parts: int | None = None
    expiring: bool = False
    fed_by: str = ""


@dataclass(frozen=True)
class StoreDecl:
    """A partition-owned key → bytes store, rebuilt from its compacted changelog.

    ``holds_work``: its live entries are work still to do (parked jobs), so a crawl is
    drained only when the broker holds none. ``ttl_setting`` names the setting (seconds)
    after which an entry expires, as the changelog forgets it by retention (``compact,
    delete``); ``tuning`` picks the store's RocksDB options (``"default"``, or ``"large"``
    for many keys: a bounded block cache with partitioned filters).
    """

    name: str
    changelog: str
    record: str
    holds_work: bool = False
    ttl_setting: str | None = None
    tuning: str = "default"

    @property
    def topic(self) -> TopicDecl:
        if self.ttl_setting is not None:
            return TopicDecl(self.changelog, self.record,
                             (("cleanup.policy", "compact,delete"),
                              ("min.compaction.lag.ms", "60000"), *CHURNING), expiring=True)
        # A parked job leaves only by its tombstone: never expired.
        return TopicDecl(self.changelog, self.record, (("cleanup.policy", "compact"),))


@dataclass(frozen=True)
class TimerDecl:
    """A keyed timer store: records waiting for a due time on the broker's clock, held in
    a compacted changelog (LogAppendTime) and fired once, even across restarts and
    rebalances (:mod:`streams.timers`). ``keyed``: at most one timer per id (scheduling an
    id again moves its timer: a page's next visit). ``holds_work``: its timers are work
    still to do (retries: a crawl is drained only once they fired); a revisit's are not (a
    next visit is planned, not pending: a crawl with revisits drains between them).
    """

    name: str
    changelog: str
    record: str
    keyed: bool = False
    holds_work: bool = True

    @property
    def topic(self) -> TopicDecl:
        return TopicDecl(self.changelog, self.record,
                         (("cleanup.policy", "compact"),
                          ("message.timestamp.type", "LogAppendTime"), *CHURNING))


@dataclass(frozen=True)
class DeployHints:
    """What a deployment gives each worker of a stage of your own (``infra/deploy_files.py``
    writes the manifests from them; the pipeline's stages are sized in
    ``infra/deploy/sizes.json``, from ``crawlfleet plan``): its memory (request = limit),
    CPU request, state volume, and the consumer lag per replica at which the autoscaler
    adds one (above what a busy worker holds read but uncommitted)."""

    memory: str = "512Mi"
    lag_per_replica: int = 1000
    cpu: str = "500m"
    disk: str = "1Gi"


@dataclass(frozen=True)
class StageSpec:
    """One consumer-group stage, declared whole.

    ``inputs`` and ``outputs`` are topic names without the crawl's prefix
    (``crawl.parsed``); the first of ``followers`` (also in ``inputs``) go wherever the lead
    input's partition N goes. ``entry`` is ``"module:Class"``: ``Class(settings, worker_id,
    stop)`` is the worker (``streams.batch_stage.BatchStage`` gives one the whole runtime).
    ``stores`` and ``timers`` are its partition-owned state, each restored from its
    changelog before the partition is used; ``label`` names its queue in progress tables.

    Traits the fleet reads: ``analytics`` (at least once, its lag is not work: run and
    shown, never waited on, left alone by chaos), ``start_late`` (begins once a fetch worker
    has joined: nothing to do in a crawl's first seconds), ``store_owner`` (owns the
    store: answers the crawl's queries, stopped last; its dropped work is redone as rows),
    ``sends_requests`` (its dropped work is redone as page requests); ``deploy``, what a
    deployment gives each of its workers.
    """

    name: str
    inputs: tuple[str, ...]
    entry: str
    followers: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    stores: tuple[StoreDecl, ...] = ()
    timers: tuple[TimerDecl, ...] = ()
    label: str = ""
    analytics: bool = False
    start_late: bool = False
    store_owner: bool = False
    sends_requests: bool = False
    deploy: DeployHints = DeployHints()

    @property
    def state(self) -> tuple[StoreDecl | TimerDecl, ...]:
        """Every partition-owned store, timer stores included."""
        return (*self.stores, *self.timers)

    @property
    def store_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.state)

    @property
    def work_stores(self) -> tuple[StoreDecl | TimerDecl, ...]:
        """The stores whose live entries are work (parked jobs, timers)."""
        return tuple(s for s in self.state if s.holds_work)

    @property
    def changelogs(self) -> tuple[str, ...]:
        return tuple(s.changelog for s in self.state)

    def store(self, name: str) -> StoreDecl:
        """The declared (non-timer) store ``name``."""
        for s in self.stores:
            if s.name == name:
                return s
        raise KeyError(f"stage {self.name!r} declares no store {name!r}")


_STAGES: dict[str, StageSpec] = {}
_TOPICS: dict[str, TopicDecl] = {}
_PIPELINE = "schemas.pipeline"
_generation = [0]  # bumped by every change of the registry (caches keyed on it)
_ready = [False]  # the pipeline's own stages are registered (or being registered)


def _declared() -> None:
    """The pipeline's own stages are registered first (importing their module does it)."""
    if not _ready[0]:
        _ready[0] = True
        importlib.import_module(_PIPELINE)


def _own() -> frozenset[str]:
    """The pipeline's own stages (never forgotten, never passed on as ``stage_modules``)."""
    own: frozenset[str] = importlib.import_module(_PIPELINE).OWN
    return own


def register_stage(spec: StageSpec, topics: tuple[TopicDecl, ...] = ()) -> None:
    """Add a stage (and the topics it adds) to every topology of this process.

    Registering the same declaration again is a no-op; a different one under a taken name
    is an error, and so are inputs or outputs no stage declared (a stage's own topics, and
    its stores' changelogs, are declared with it).
    """
    _declared()
    new = {d.name: d for d in (*topics, *(s.topic for s in spec.state))}
    for decl in new.values():
        if _TOPICS.get(decl.name, decl) != decl:
            raise ValueError(f"topic {decl.name!r} is already declared otherwise")
    if _STAGES.get(spec.name, spec) != spec:
        raise ValueError(f"stage {spec.name!r} is already declared")
    if not spec.inputs or not set(spec.followers) <= set(spec.inputs[1:]):
        raise ValueError(f"stage {spec.name!r}: inputs must be given, followers among them")
    unknown = [t for t in (*spec.inputs, *spec.outputs) if t not in _TOPICS and t not in new]
    if unknown:
        raise ValueError(f"stage {spec.name!r}: undeclared topics {', '.join(unknown)}")
    names = spec.store_names
    if len(set(names)) != len(names):
        raise ValueError(f"stage {spec.name!r}: two stores share a name")
    _TOPICS.update(new)
    _STAGES[spec.name] = spec
    _generation[0] += 1


def unregister_stage(name: str, topics: tuple[str, ...] = ()) -> None:
    """Forget a user's stage and the named topics (a test's own stage, after it)."""
    _declared()
    spec = _STAGES.get(name)
    if name in _own():
        raise ValueError(f"stage {name!r} is the pipeline's own")
    _STAGES.pop(name, None)
    for topic in (*topics, *(spec.changelogs if spec else ())):
        _TOPICS.pop(topic, None)
    _generation[0] += 1


def generation() -> int:
    """A number that changes whenever a stage or topic is registered or forgotten."""
    _declared()
    return _generation[0]


def declared_topics() -> tuple[TopicDecl, ...]:
    """Every topic, in the order declared (the pipeline's, then users')."""
    _declared()
    return tuple(_TOPICS.values())


def user_topics() -> tuple[TopicDecl, ...]:
    """The topics users' stages add as outputs (their stores' changelogs aside), in the
    order declared: chaos holds each to one committed record per key."""
    _declared()
    own: frozenset[str] = importlib.import_module(_PIPELINE).OWN_TOPICS
    changelogs = {c for s in _STAGES.values() for c in s.changelogs}
    return tuple(d for d in _TOPICS.values() if d.name not in own and d.name not in changelogs)


def declared_modules() -> tuple[str, ...]:
    """Modules of the users' stages registered in this process (each declared where its
    worker class lives): the ``stage_modules`` a child process needs to know them too."""
    _declared()
    own = _own()
    return tuple(sorted({s.entry.partition(":")[0] for s in _STAGES.values()
                         if s.name not in own}))


def all_specs() -> tuple[StageSpec, ...]:
    """Every declared stage, the analytics ones included, in the order declared."""
    _declared()
    return tuple(_STAGES.values())


def stages() -> tuple[str, ...]:
    """The stages that do the crawl's work (a job's order through the pipeline, then users'
    stages): every one is waited on by the drain check."""
    return tuple(s.name for s in all_specs() if not s.analytics)


def analytics_stages() -> tuple[str, ...]:
    """The analytics stages: run and shown, never waited on."""
    return tuple(s.name for s in all_specs() if s.analytics)


def every_stage() -> tuple[str, ...]:
    """The working stages, then the analytics ones: every group the fleet runs."""
    return (*stages(), *analytics_stages())


def stage_spec(stage: str) -> StageSpec:
    _declared()
    spec = _STAGES.get(stage)
    if spec is None:
        raise KeyError(f"unknown stage {stage!r}; stages are {', '.join(every_stage())}")
    return spec


def stages_where(trait: str) -> tuple[str, ...]:
    """The stages with a true ``trait`` (``start_late``, ``store_owner``,
    ``sends_requests``, ``analytics``)."""
    return tuple(s.name for s in all_specs() if getattr(s, trait))
