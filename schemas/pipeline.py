"""The pipeline's own stages and topics, registered as a user registers theirs.

A job's way through them: ``crawl.frontier`` → fetch → ``crawl.fetched`` → parse →
``crawl.parsed`` → store (ClickHouse), with retry holding delayed jobs on timers and
putting them back on the frontier, revisit doing the same with a page's next visit
(``crawl.revisits``), and the quarantine app (analytics, at least once) counting blocks
into control records. ``crawlfleet top --graph`` draws it from these declarations
(:func:`schemas.graph.draw`).
"""

from __future__ import annotations

from schemas.stages import (
    DAY_MS,
    WEEK,
    StageSpec,
    StoreDecl,
    TimerDecl,
    TopicDecl,
    all_specs,
    declared_topics,
    register_stage,
    stage_spec,
)

#: Retry tiers: (delay in seconds, topic suffix). Attempt n waits in the first tier whose
#: delay is at least what the failure asked for (Retry-After or back-off).
RETRY_DELAYS_S: tuple[int, ...] = (2, 15, 120)
#: The quarantine app's faust table (one state record per target, see
#: ``streams.quarantine_rules``); faust names its changelog ``{app id}-{table}-changelog``.
QUARANTINE_TABLE = "counts"

_BIG = ("max.message.bytes", str(16 * 1024 * 1024))
_MONTH = (("cleanup.policy", "delete"), ("retention.ms", str(30 * DAY_MS)))
RETRY_TIERS = tuple(f"crawl.retry.{d}s" for d in RETRY_DELAYS_S)

TOPICS = (
    TopicDecl("crawl.frontier", "CrawlJob", fed_by="publish"),
    TopicDecl("crawl.frontier.high", "CrawlJob", fed_by="publish"),
    TopicDecl("crawl.fetched", "FetchResult", (*WEEK, _BIG)),
    TopicDecl("crawl.parsed", "ParsedPage", (*WEEK, _BIG)),
    TopicDecl("crawl.dead", "DeadLetter", _MONTH),
    # Read by every worker's control reader (not as a group input), written by operators.
    TopicDecl("crawl.control", "Control", (("cleanup.policy", "compact"),), by_target=False,
              parts=1, fed_by="operator"),
    TopicDecl("crawl.telemetry", "FetchEvent"),
    # The telemetry events of blocked attempts again, for the quarantine app: it reads
    # these instead of every attempt's (its cost was a tenth of a crawl's CPU).
    TopicDecl("crawl.blocks", "FetchEvent"),
    # Job state changes no other topic shows (enqueued, duplicate, parked, released).
    TopicDecl("crawl.lineage", "LineageEvent"),
    # Every quarantine the quarantine app issued, for the store (``quarantines``).
    TopicDecl("crawl.quarantines", "QuarantineEvent", _MONTH),
    # Retry tiers use the broker's clock for the record timestamp: the delay is measured
    # from when the broker appended the record, never from a worker's clock.
    *(TopicDecl(t, "CrawlJob", (*WEEK, ("message.timestamp.type", "LogAppendTime")))
      for t in RETRY_TIERS),
    # A page's next visit, written by parse with its page (delay_ms: the interval), held by
    # the revisit stage until due: broker time, as the retry tiers.
    TopicDecl("crawl.revisits", "CrawlJob",
              (*WEEK, ("message.timestamp.type", "LogAppendTime"))),
    # The quarantine app's table: one record per target, compacted (faust writes each
    # partition's entries to the blocks partition of their target).
    TopicDecl(f"crawlfleet-quarantine-{QUARANTINE_TABLE}-changelog", "QuarantineCounts",
              (("cleanup.policy", "compact"),)),
)

#: Every stage writes dead letters and most write lineage; the rest is each stage's own.
_EVERYWHERE = ("crawl.dead", "crawl.lineage")

FETCH = StageSpec(
    "fetch", ("crawl.frontier", "crawl.frontier.high"), "consumers.fetch.stage:FetchStage",
    followers=("crawl.frontier.high",),
    outputs=("crawl.fetched", *RETRY_TIERS, "crawl.telemetry", "crawl.blocks",
             "crawl.frontier", "crawl.frontier.high", "crawl.control", *_EVERYWHERE),
    stores=(StoreDecl("seen", "crawl.seen", "Seen", ttl_setting="seen_ttl_s", tuning="large"),
            StoreDecl("parked", "crawl.parked", "CrawlJob", holds_work=True)),
    label="frontier", sends_requests=True)
PARSE = StageSpec(
    "parse", ("crawl.fetched",), "consumers.parse:ParseStage",
    outputs=("crawl.parsed", "crawl.frontier", "crawl.frontier.high", "crawl.telemetry",
             "crawl.revisits", *_EVERYWHERE),
    label="fetched→parse")
STORE = StageSpec(
    "store", ("crawl.parsed", "crawl.telemetry", "crawl.dead", "crawl.lineage",
              "crawl.quarantines"), "consumers.store:StoreStage",
    outputs=("crawl.dead",),  # what it cannot store (see consumers.store)
    label="parsed→store", store_owner=True)
RETRY = StageSpec(
    "retry", RETRY_TIERS, "consumers.retry:RetryStage", followers=RETRY_TIERS[1:],
    outputs=("crawl.frontier", "crawl.frontier.high", *_EVERYWHERE),
    timers=(TimerDecl("timers", "crawl.timers", "CrawlJob"),),
    label="retry", start_late=True)
REVISIT = StageSpec(
    "revisit", ("crawl.revisits",), "consumers.revisit:RevisitStage",
    outputs=("crawl.frontier", "crawl.frontier.high", *_EVERYWHERE),
    timers=(TimerDecl("due", "crawl.revisit.timers", "CrawlJob", keyed=True,
                      holds_work=False),),
    label="revisit", start_late=True)
QUARANTINE = StageSpec(
    "quarantine", ("crawl.blocks",), "streams.quarantine:QuarantineWorker",
    outputs=("crawl.control", "crawl.quarantines",
             f"crawlfleet-quarantine-{QUARANTINE_TABLE}-changelog"),
    label="blocks→quarantine", analytics=True, start_late=True)

#: The topics that carry page bodies: a stage touching them costs with the page size.
PAGE_TOPICS = frozenset({"crawl.fetched", "crawl.parsed"})


def handles_pages(stage: str) -> bool:
    """Does ``stage`` read or write page bodies (:data:`PAGE_TOPICS`)?"""
    spec = stage_spec(stage)
    return bool(PAGE_TOPICS & {*spec.inputs, *spec.outputs})


register_stage(FETCH, TOPICS)
for _spec in (PARSE, STORE, RETRY, REVISIT, QUARANTINE):
    register_stage(_spec)

#: The stages and topics declared here: the pipeline's own, never forgotten.
OWN = frozenset(s.name for s in all_specs())
OWN_TOPICS = frozenset(d.name for d in declared_topics())
