"""Idempotent topic provisioning from the one topology declaration in ``schemas.topics``."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

# confluent-kafka 2.16's typed admin package re-exports NewTopic without marking it public.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from consumers.runtime import topology_of
from crawlfleet.config import Settings
from crawlfleet.errors import InfraError


def create_topics(settings: Settings, timeout_s: float = 30.0) -> dict[str, str]:
    """Create every missing topic; returns {topic: "created" | "exists"}."""
    admin = AdminClient(settings.kafka_common())
    specs = topology_of(settings).specs()
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
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
    return result
