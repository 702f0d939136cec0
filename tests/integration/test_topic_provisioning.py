"""Topic provisioning on the real broker: create is idempotent, delete removes only its own."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from core.config import Settings
from core.errors import InfraError
from infra.topics import adopt_partitions, create_topics, delete_topics, topology_of


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


def test_existing_topics_decide_an_automatic_partition_count(settings: Settings) -> None:
    """Producers pick partitions from the count: it must be the topics' real one."""
    auto = settings.replace(partitions=0)
    assert adopt_partitions(auto).partitions == 12  # nothing exists yet: the shared default
    create_topics(settings.replace(partitions=3))
    assert adopt_partitions(auto).partitions == 3
    assert adopt_partitions(settings.replace(partitions=7)).partitions == 7  # explicit wins
    with pytest.raises(InfraError, match=r"exists with 3 partitions.*CRAWLFLEET_PARTITIONS=3"):
        create_topics(settings.replace(partitions=5))
    assert set(create_topics(adopt_partitions(auto)).values()) == {"exists"}
