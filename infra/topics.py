"""Idempotent topic provisioning from the one topology declaration in ``schemas.topics``."""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException

# confluent-kafka 2.16's typed admin package re-exports NewTopic without marking it public.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from consumers.runtime import topology_of
from crawlfleet.config import DEFAULT_PARTITIONS, Settings
from crawlfleet.errors import InfraError

log = logging.getLogger("crawlfleet.topics")


def create_topics(settings: Settings, timeout_s: float = 30.0) -> dict[str, str]:
    """Create every missing topic; returns {topic: "created" | "exists"}.

    An existing topic with another partition count than the configuration's is refused:
    producers pick a target's partition from that count, so a mismatch would send a
    target's jobs to a partition its owner does not hold.
    """
    admin = AdminClient(settings.kafka_common())
    specs = topology_of(settings).specs()
    try:
        metadata = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    existing = {name for name, t in metadata.items() if t.error is None}
    for spec in specs:
        if spec.name in existing and len(metadata[spec.name].partitions) != spec.partitions:
            have = len(metadata[spec.name].partitions)
            raise InfraError(f"topic {spec.name} exists with {have} partitions, but this "
                             f"configuration says {spec.partitions}: set partitions = {have} "
                             f"(CRAWLFLEET_PARTITIONS={have}) to use these topics")
    result = {s.name: "exists" for s in specs if s.name in existing}
    new = [NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication,
                    config=s.config) for s in specs if s.name not in existing]
    if not new:
        return result
    for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            fut.result()
            result[name] = "created"
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfraError(f"cannot create topic {name}: {err.str()}") from exc
            result[name] = "exists"
    _await_leaders(admin, {s.name: s.partitions for s in specs}, timeout_s)
    return result


def existing_partitions(settings: Settings, timeout_s: float = 10.0) -> int | None:
    """Partition count of this prefix's existing frontier topic (None if it does not exist)."""
    admin = AdminClient(settings.kafka_common())
    name = topology_of(settings).frontier
    try:
        # All topics, not list_topics(topic=...): that could auto-create it on some brokers.
        topic = admin.list_topics(timeout=timeout_s).topics.get(name)
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    if topic is None or topic.error is not None or not topic.partitions:
        return None
    return len(topic.partitions)


def adopt_partitions(settings: Settings) -> Settings:
    """``settings`` with an automatic (0) partition count made concrete.

    Existing topics decide (a one-off crawl's topics may have fewer than the default, and
    every producer must pick partitions from the real count); else the shared default.
    """
    if settings.partitions:
        return settings
    return settings.replace(partitions=existing_partitions(settings) or DEFAULT_PARTITIONS)


def _await_leaders(admin: AdminClient, partitions: dict[str, int], timeout_s: float) -> None:
    """Wait until the brokers' metadata shows every partition with a leader.

    A creation is confirmed by the controller before every broker's metadata has it; clients
    that start at once would see unknown topics or leaderless partitions and back off for
    up to a second before their first fetch.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            topics = admin.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
        except KafkaException:
            topics = {}
        missing = [name for name, n in partitions.items()
                   if name not in topics or topics[name].error is not None
                   or len(topics[name].partitions) < n
                   or any(p.leader < 0 for p in topics[name].partitions.values())]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise InfraError(f"topics without leaders after {timeout_s:.0f} s: "
                             f"{', '.join(sorted(missing))}")
        time.sleep(0.05)


def _await_gone(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """Wait until the brokers' metadata no longer lists ``names`` (it lags the controller's
    confirmation, as for creations), so a caller that lists topics next sees them gone."""
    deadline = time.monotonic() + timeout_s
    while names:
        try:
            listed = set(admin.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics)
        except KafkaException:
            listed = set(names)
        if not listed & set(names):
            return
        if time.monotonic() >= deadline:
            log.warning("deleted topics still listed after %.0f s: %s", timeout_s,
                        ", ".join(sorted(listed & set(names))))
            return
        time.sleep(0.05)


def delete_topics(settings: Settings, stages: tuple[str, ...] = ("fetch", "parse", "store",
                                                                  "retry"),
                  timeout_s: float = 30.0) -> list[str]:
    """Delete every topic of the topology and its stages' consumer groups (best effort).

    For the all-in-one crawl's own per-run prefix: its results live in ClickHouse, and a
    broker that keeps every finished crawl's partitions gets slower with each one.
    Returns the topics deleted.
    """
    admin = AdminClient(settings.kafka_common())
    topo = topology_of(settings)
    # No list_topics filter: a broker's metadata view can lag a creation it just confirmed.
    names = [s.name for s in topo.specs()]
    deleted = []
    try:
        futures = admin.delete_topics(names, operation_timeout=timeout_s)
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    for name, fut in futures.items():
        try:
            fut.result()
            deleted.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                log.warning("topic %s not deleted: %s", name, exc)
    _await_gone(admin, deleted, timeout_s)
    groups = [topo.group(stage) for stage in stages]
    for group, fut in admin.delete_consumer_groups(groups, request_timeout=timeout_s).items():
        try:
            fut.result()
        except KafkaException as exc:  # never created, or still has members
            log.debug("group %s not deleted: %s", group, exc)
    return deleted
