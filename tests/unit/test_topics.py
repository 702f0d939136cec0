"""The topology: partitioning like Kafka's Java client, topic configs, retry tiers."""

from __future__ import annotations

import random
import string

import pytest

from schemas.pipeline import RETRY_DELAYS_S
from schemas.topics import Topology, _murmur2, partition_for

# Vectors from Kafka's own tests (org.apache.kafka.common.utils.UtilsTest#testMurmur2).
MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("data", "expected"), MURMUR2_VECTORS)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert _murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), MURMUR2_VECTORS)
@pytest.mark.parametrize("n", [1, 3, 12, 100])
def test_partition_for_matches_java_default_partitioner(data: bytes, expected: int,
                                                        n: int) -> None:
    assert partition_for(data.decode(), n) == (expected & 0x7FFFFFFF) % n


def test_murmur2_covers_every_tail_length() -> None:
    # lengths 0..3 mod 4 take different tail branches; results must be 32-bit signed ints
    # and differ from each other.
    values = {_murmur2(b"abcd"[:k] + b"wxyz") for k in range(4)}
    assert len(values) == 4
    for k in range(9):
        h = _murmur2(b"x" * k)
        assert -(2**31) <= h < 2**31


def test_partition_for_is_stable_and_in_range() -> None:
    rng = random.Random(1)
    targets = ["".join(rng.choices(string.ascii_lowercase + ".-", k=rng.randint(1, 40)))
               for _ in range(500)]
    for t in targets:
        p = partition_for(t, 12)
        assert 0 <= p < 12
        assert partition_for(t, 12) == p
        assert (_murmur2(t.encode()) & 0x7FFFFFFF) % 12 == p


def test_partition_for_spreads_targets() -> None:
    counts = [0] * 12
    for i in range(1200):
        counts[partition_for(f"site{i}.example.com", 12)] += 1
    assert min(counts) > 50  # roughly uniform, no dead partitions


def test_partition_for_unicode_target_uses_utf8() -> None:
    assert partition_for("bücher.de", 12) == (_murmur2("bücher.de".encode()) & 0x7FFFFFFF) % 12


# --- topology -----------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 12, 30])
def test_target_partitioned_topics_share_partition_count(partitions: int) -> None:
    topo = Topology(partitions=partitions)
    by_target = [s for s in topo.specs() if s.by_target]
    assert {s.name for s in by_target} >= {topo.frontier, topo.frontier_high, topo.fetched,
                                           topo.parsed, topo.seen, *topo.retry_topics}
    assert {s.partitions for s in by_target} == {partitions}


def test_topic_names_are_unique_and_prefixed() -> None:
    topo = Topology(prefix="t42.")
    names = [s.name for s in topo.specs()]
    assert len(names) == len(set(names))
    # faust names its table changelog after the app id, which is the stage's group.
    assert all(n.startswith("t42.crawl.") for n in names if n != topo.quarantine_changelog)
    assert topo.quarantine_changelog == "t42.crawlfleet-quarantine-counts-changelog"
    assert topo.quarantine_app == topo.group("quarantine") == "t42.crawlfleet-quarantine"
    assert topo.group("fetch") == "t42.crawlfleet-fetch"
    assert Topology().frontier == "crawl.frontier"


def test_state_store_changelogs_are_compacted_and_never_expire() -> None:
    topo = Topology()
    for name in (topo.parked, topo.timers):
        spec = topo.spec(name)
        assert spec.config["cleanup.policy"] == "compact"  # no delete: a job leaves by tombstone
        assert spec.by_target and spec.record == "CrawlJob"
    # A timer's due time is measured from the broker's clock, never a worker's.
    assert topo.spec(topo.timers).config["message.timestamp.type"] == "LogAppendTime"


def test_seen_is_compacted() -> None:
    topo = Topology(seen_retention_ms=123_456)
    seen = topo.spec(topo.seen)
    assert "compact" in seen.config["cleanup.policy"].split(",")
    assert seen.config["retention.ms"] == "123456"
    assert seen.record == "Seen"
    assert seen.by_target


def test_control_is_compact_single_partition() -> None:
    topo = Topology(partitions=24)
    control = topo.spec(topo.control)
    assert control.config["cleanup.policy"] == "compact"
    assert control.partitions == 1
    assert not control.by_target
    assert control.record == "Control"


def test_retry_topics_use_log_append_time() -> None:
    topo = Topology()
    assert topo.retry_topics == [f"crawl.retry.{d}s" for d in RETRY_DELAYS_S]
    for name in topo.retry_topics:
        spec = topo.spec(name)
        assert spec.config["message.timestamp.type"] == "LogAppendTime"
        assert spec.record == "CrawlJob"
    for spec in topo.specs():
        if spec.name not in [*topo.retry_topics, topo.timers, topo.revisits,
                             "crawl.revisit.timers"]:
            assert "message.timestamp.type" not in spec.config


def test_other_topics_delete_and_records() -> None:
    topo = Topology()
    records = {s.name: s.record for s in topo.specs()}
    assert records[topo.frontier] == "CrawlJob"
    assert records[topo.frontier_high] == "CrawlJob"
    assert records[topo.fetched] == "FetchResult"
    assert records[topo.parsed] == "ParsedPage"
    assert records[topo.dead] == "DeadLetter"
    assert records[topo.telemetry] == "FetchEvent"
    for name in (topo.frontier, topo.fetched, topo.parsed, topo.dead, topo.telemetry):
        assert topo.spec(name).config["cleanup.policy"] == "delete"


def test_min_insync_replicas_follows_replication() -> None:
    assert {s.config["min.insync.replicas"] for s in Topology(replication=1).specs()} == {"1"}
    assert {s.config["min.insync.replicas"] for s in Topology(replication=3).specs()} == {"2"}
    assert {s.replication for s in Topology(replication=3).specs()} == {3}


def test_spec_unknown_name() -> None:
    with pytest.raises(KeyError):
        Topology().spec("crawl.nope")


@pytest.mark.parametrize(
    ("wait", "tier"),
    [(0, 2), (0.5, 2), (2, 2), (2.01, 15), (15, 15), (16, 120), (120, 120), (121, 120),
     (10_000, 120)],
)
def test_retry_tier_for(wait: float, tier: int) -> None:
    assert Topology().retry_tier_for(wait) == tier


def test_retry_tiers_are_sorted_topics() -> None:
    assert list(RETRY_DELAYS_S) == sorted(RETRY_DELAYS_S)
    topo = Topology()
    for d in RETRY_DELAYS_S:
        assert topo.retry(topo.retry_tier_for(d)) in topo.retry_topics


def test_every_stage_declares_its_inputs_once() -> None:
    from schemas.stages import analytics_stages, stages
    topo = Topology(prefix="p.")
    assert stages() == ("fetch", "parse", "store", "retry", "revisit")
    assert analytics_stages() == ("quarantine",)
    assert topo.inputs("fetch") == [topo.frontier, topo.frontier_high]
    assert topo.inputs("parse") == [topo.fetched]
    assert topo.inputs("store") == [topo.parsed, topo.telemetry, topo.dead, topo.lineage,
                                    topo.quarantines]
    assert topo.inputs("quarantine") == [topo.blocks]  # analytics: not in stages()
    assert topo.inputs("retry") == topo.retry_topics
    names = {s.name for s in topo.specs()}
    assert all(set(topo.inputs(st)) <= names for st in stages())
    with pytest.raises(KeyError, match="unknown stage"):
        topo.inputs("nope")


def test_record_of_every_topic_comes_from_its_spec() -> None:
    topo = Topology(prefix="p.")
    for spec in topo.specs():
        assert topo.record_of(spec.name) == spec.record
    assert topo.record_of(topo.parked) == "CrawlJob"
    with pytest.raises(KeyError):
        topo.record_of("p.crawl.nothing")


def test_co_partitioned_inputs_follow_one_subscribed_lead_topic() -> None:
    """Both frontier tiers (one cap, one dedupe store) and every retry tier (one timer
    store) must share an owner per partition: only the lead is left to the assignor."""
    from schemas.stages import stages
    topo = Topology(prefix="p.")
    assert topo.subscription("fetch") == [topo.frontier]
    assert topo.followers("fetch") == [topo.frontier_high]
    assert topo.subscription("retry") == topo.retry_topics[:1]
    assert topo.followers("retry") == topo.retry_topics[1:]
    for stage in ("parse", "store"):  # independent partitions: the assignor spreads them
        assert topo.followers(stage) == [] and topo.subscription(stage) == topo.inputs(stage)
    for stage in stages():  # nothing read that is not declared, nothing declared left unread
        assert sorted(topo.subscription(stage) + topo.followers(stage)) == \
            sorted(topo.inputs(stage))


def test_a_declared_stage_joins_every_topology_and_leaves_cleanly() -> None:
    from schemas.stages import (
        StageSpec,
        TopicDecl,
        register_stage,
        stage_spec,
        stages,
        unregister_stage,
    )
    from schemas.topics import Topology
    spec = StageSpec("extra", ("crawl.parsed", "crawl.dead"), "x:Y", followers=("crawl.dead",))
    register_stage(spec, (TopicDecl("crawl.extra", "ParsedPage"),))
    try:
        register_stage(spec, (TopicDecl("crawl.extra", "ParsedPage"),))  # the same: a no-op
        topo = Topology(prefix="p.")
        assert stages()[-1] == "extra" and stage_spec("extra") is spec
        assert topo.subscription("extra") == ["p.crawl.parsed"]
        assert topo.followers("extra") == ["p.crawl.dead"]
        assert topo.record_of("p.crawl.extra") == "ParsedPage"
        with pytest.raises(ValueError, match="already declared"):
            register_stage(StageSpec("extra", ("crawl.fetched",), "x:Z"))
        with pytest.raises(ValueError, match="already declared"):
            register_stage(StageSpec("fetch", ("crawl.fetched",), "x:Z"))
        with pytest.raises(ValueError, match="followers among them"):
            register_stage(StageSpec("other", ("crawl.parsed",), "x:Z",
                                     followers=("crawl.dead",)))
    finally:
        unregister_stage("extra", ("crawl.extra",))
    assert "extra" not in stages()
    assert "p.crawl.extra" not in {s.name for s in Topology(prefix="p.").specs()}
