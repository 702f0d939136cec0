"""Topic provisioning on the real broker: create is idempotent, delete removes only its own."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from consumers.runtime import topology_of
from crawlfleet.config import Settings
from infra.topics import create_topics, delete_topics


def _topics(settings: Settings) -> set[str]:
    return set(AdminClient(settings.kafka_common()).list_topics(timeout=10).topics)


def test_create_twice_then_delete_only_this_prefix(settings: Settings) -> None:
    names = {s.name for s in topology_of(settings).specs()}
    first = create_topics(settings)
    assert set(first) == names and set(first.values()) == {"created"}
    assert set(create_topics(settings).values()) == {"exists"}

    other = settings.replace(topic_prefix=settings.topic_prefix.rstrip(".") + "x.")
    create_topics(other)
    try:
        assert sorted(delete_topics(settings)) == sorted(names)
        left = _topics(settings)
        assert not names & left
        assert {s.name for s in topology_of(other).specs()} <= left  # the neighbour stays
        assert delete_topics(settings) == []  # nothing left: a no-op, not an error
    finally:
        delete_topics(other)
