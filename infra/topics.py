"""Idempotent topic provisioning from the one topology declaration in ``schemas.topics``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from confluent_kafka import KafkaError, KafkaException

# confluent-kafka 2.16's typed admin package re-exports NewTopic without marking it public.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from core.config import DEFAULT_PARTITIONS, Settings
from core.errors import InfraError
from schemas.stages import every_stage
from schemas.topics import Topology


def topology_of(settings: Settings) -> Topology:
    """The topology (topic names, partitions, replication) of these settings' crawl."""
    return Topology(prefix=settings.topic_prefix, partitions=settings.topic_partitions,
                    replication=settings.replication,
                    seen_retention_ms=int(settings.seen_ttl_s * 1000))


log = logging.getLogger("crawlfleet.topics")


class NamespaceTakenError(InfraError):
    """A fresh namespace's prefix already names topics or groups: someone else's crawl."""

    reason = "namespace_taken"


def create_topics(settings: Settings, timeout_s: float = 30.0, *,
                  fresh: bool = False) -> dict[str, str]:
    """Create every missing topic; returns {topic: "created" | "exists"}.

    An existing topic with another partition count than the configuration's is refused:
    producers pick a target's partition from that count, so a mismatch would send a
    target's jobs to a partition its owner does not hold.

    ``fresh``: the caller opens a new namespace (a one-off crawl) and will later delete it,
    so it must own everything under its prefix. Any topic or consumer group of the prefix
    that already exists, or a creation the broker answers "already exists" (another client
    created it since), is refused with :class:`NamespaceTakenError` after deleting the
    topics this call created: adopting them would share transactional ids and static
    members with their owner, and deleting them later would pull its topics from under it.
    Without ``fresh`` existing topics are adopted (a resumed crawl, shared topics).
    """
    if fresh and not settings.topic_prefix:
        raise NamespaceTakenError("a fresh namespace needs a topic prefix of its own")
    admin = AdminClient(settings.kafka_common())
    specs = topology_of(settings).specs()
    metadata = _list_topics(admin, settings, timeout_s)
    existing = {name for name, t in metadata.items() if t.error is None}
    if fresh:
        taken = sorted(n for n in metadata if n.startswith(settings.topic_prefix))
        groups = _list_groups(admin, settings, timeout_s)
        if taken or groups:
            raise _taken(settings, taken, groups)
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
    failure: InfraError | None = None
    for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            fut.result()
            result[name] = "created"
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                failure = failure or InfraError(f"cannot create topic {name}: {err.str()}")
            elif fresh:
                failure = failure or _taken(settings, [name], [])
            else:
                result[name] = "exists"
    if failure is not None:
        if fresh:  # leave the prefix as it was: nothing half-made for its owner to trip on
            delete_topics(settings, topics=[n for n, v in result.items() if v == "created"],
                          stages=(), timeout_s=timeout_s)
        raise failure
    def leaderless(topics: dict[str, Any]) -> list[str]:
        return [t.name for t in specs if t.name not in topics or topics[t.name].error is not None
                or len(topics[t.name].partitions) < t.partitions
                or any(p.leader < 0 for p in topics[t.name].partitions.values())]
    missing = _await_metadata(admin, leaderless, timeout_s)
    if missing:
        raise InfraError(f"topics without leaders after {timeout_s:.0f} s: "
                         f"{', '.join(sorted(missing))}")
    return result


def _taken(settings: Settings, topics: list[str], groups: list[str]) -> NamespaceTakenError:
    found = [*topics, *(f"group {g}" for g in groups)]
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return NamespaceTakenError(
        f"topic prefix {settings.topic_prefix} is already in use ({', '.join(found[:3])}{more}):"
        " a new crawl never adopts or deletes another's topics; resume that crawl with "
        f"--topic-prefix {settings.topic_prefix}, or start this one without --topic-prefix")


def missing_topics(settings: Settings, names: list[str], timeout_s: float = 10.0) -> list[str]:
    """Those of ``names`` the cluster does not have (nothing is created by asking)."""
    metadata = _list_topics(AdminClient(settings.kafka_common()), settings, timeout_s)
    return sorted(n for n in names if n not in metadata or metadata[n].error is not None)


def existing_partitions(settings: Settings, timeout_s: float = 10.0) -> int | None:
    """Partition count of this prefix's existing frontier topic (None if it does not exist)."""
    admin = AdminClient(settings.kafka_common())
    topic = _list_topics(admin, settings, timeout_s).get(topology_of(settings).frontier)
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


def _list_topics(admin: AdminClient, settings: Settings, timeout_s: float) -> dict[str, Any]:
    """Every topic's metadata (all topics: asking for one by name can auto-create it)."""
    try:
        return dict(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc


#: Group-listing refusals a moment cures: a broker just started is still loading its group
#: coordinator (a `crawl` right after `crawlfleet kafka up` met it).
_COORDINATOR_LOADING = frozenset({KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                  KafkaError.COORDINATOR_NOT_AVAILABLE})


def _error_code(err: Any) -> Any:
    """The code of a listing error (a KafkaError, or a KafkaException wrapping one)."""
    inner = err.args[0] if isinstance(err, KafkaException) and err.args else err
    return inner.code() if hasattr(inner, "code") else None


def _list_groups(admin: AdminClient, settings: Settings, timeout_s: float) -> list[str]:
    """This prefix's consumer groups, empty ones (committed offsets, no members) included;
    asked again while a coordinator is still loading (until ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listing = admin.list_consumer_groups(request_timeout=timeout_s).result()
        except KafkaException as exc:
            raise InfraError(f"cannot list consumer groups at {settings.bootstrap_servers}: "
                             f"{exc}") from exc
        if not listing.errors:
            break
        loading = all(_error_code(e) in _COORDINATOR_LOADING for e in listing.errors)
        if not loading or time.monotonic() >= deadline:
            # a broker that did not answer may hold one of ours
            raise InfraError(f"cannot list every consumer group at "
                             f"{settings.bootstrap_servers}: {listing.errors[0]}")
        time.sleep(0.2)
    return sorted(g.group_id for g in listing.valid if g.group_id.startswith(settings.topic_prefix))


def _await_metadata(admin: AdminClient, pending: Callable[[dict[str, Any]], list[str]],
                    timeout_s: float) -> list[str]:
    """Poll the brokers' metadata until ``pending(topics)`` is empty; what is left at timeout.

    The controller confirms creations and deletions before every broker's metadata shows
    them; clients that act at once would see unknown or leaderless partitions (and back off
    for up to a second) or topics that are already gone.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            topics = admin.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
        except KafkaException:
            topics = None
        left = pending(topics) if topics is not None else ["(metadata unavailable)"]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def delete_topics(settings: Settings, stages: tuple[str, ...] | None = None,
                  timeout_s: float = 30.0, *,
                  topics: Collection[str] | None = None) -> list[str]:
    """Delete the topology's topics (or only ``topics``) and ``stages``' groups (best effort).

    For the all-in-one crawl's own per-run prefix: its results live in ClickHouse, and a
    broker that keeps every finished crawl's partitions gets slower with each one. A crawl
    passes ``topics``, the ones it created itself, so it never deletes what it found.
    Returns the topics deleted.
    """
    admin = AdminClient(settings.kafka_common())
    topo = topology_of(settings)
    # No list_topics filter: a broker's metadata view can lag a creation it just confirmed.
    names = [s.name for s in topo.specs()] if topics is None else sorted(topics)
    deleted: list[str] = []
    if names:
        deleted = _delete_named(admin, settings, names, timeout_s)
    groups = [topo.group(stage) for stage in (every_stage() if stages is None else stages)]
    if not groups:
        return deleted
    for group, fut in admin.delete_consumer_groups(groups, request_timeout=timeout_s).items():
        try:
            fut.result()
        except KafkaException as exc:  # never created, or still has members
            log.debug("group %s not deleted: %s", group, exc)
    return deleted


def _delete_named(admin: AdminClient, settings: Settings, names: list[str],
                  timeout_s: float) -> list[str]:
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
    listed = _await_metadata(admin, lambda topics: [n for n in deleted if n in topics], timeout_s)
    if listed:
        log.warning("deleted topics still listed after %.0f s: %s", timeout_s,
                    ", ".join(sorted(listed)))
    return deleted
