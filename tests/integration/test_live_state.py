"""infra.live_state on the real broker: live entries of a compacted changelog, as a
transactional writer leaves them (committed, open, aborted)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from fleet_helpers import create_all_topics

from core.config import Settings
from infra.live_state import LiveReader, live_entries
from infra.topics import topology_of

pytestmark = pytest.mark.integration


def txn_producer(settings: Settings) -> Producer:
    p = Producer({**settings.kafka_common(), "transactional.id": f"live-{uuid.uuid4().hex}",
                  "enable.idempotence": True})
    p.init_transactions(30)
    return p


def write(p: Producer, topic: str, records: list[tuple[int, bytes, bytes | None]],
          commit: bool | None) -> None:
    """One transaction of (partition, key, value) records: committed (True), aborted
    (False) or left open (None)."""
    p.begin_transaction()
    for part, key, value in records:
        p.produce(topic, key=key, value=value, partition=part)
    p.flush(30)
    if commit is True:
        p.commit_transaction(30)
    elif commit is False:
        p.abort_transaction(30)


def test_live_entries_follow_committed_open_and_aborted_transactions(
        settings: Settings) -> None:
    create_all_topics(settings)
    topo = topology_of(settings)
    topic, parts = topo.parked, topo.partitions
    assert live_entries(settings, topic, parts).total == 0  # an empty changelog: settled
    p = txn_producer(settings)

    write(p, topic, [(0, b"a", b"1"), (0, b"b", b"1"), (1, b"c", b"1")], commit=True)
    write(p, topic, [(0, b"b", None), (0, b"a", b"2")], commit=True)  # b deleted, a rewritten
    live = live_entries(settings, topic, parts)
    assert live.settled and live.counts == {0: 1, 1: 1, 2: 0, 3: 0}
    assert live.keys[0] == {b"a"} and live.keys[1] == {b"c"}

    # An open transaction: its partition is unsettled (work whose fate is not known yet);
    # the others are still counted exactly, and its writes are not counted as live.
    write(p, topic, [(2, b"d", b"1"), (1, b"c", None)], commit=None)
    live = live_entries(settings, topic, parts, timeout_s=3)
    assert live.unsettled == {1, 2}, live
    assert live.counts[0] == 1 and live.counts[2] == 0

    p.abort_transaction(30)  # aborted: as if it never happened
    live = live_entries(settings, topic, parts)
    assert live.settled and live.counts == {0: 1, 1: 1, 2: 0, 3: 0}, live

    write(p, topic, [(2, b"e", b"1")], commit=False)
    write(p, topic, [(3, b"f", b"1")], commit=True)
    live = live_entries(settings, topic, parts)
    assert live.settled and live.counts == {0: 1, 1: 1, 2: 0, 3: 1}, live
    assert live.total == 3


def test_one_reader_counts_again_and_again_and_skips_an_unchanged_changelog(
        settings: Settings) -> None:
    # The store's sampler reads the same changelogs every 10 s with one reader (issue 43:
    # new clients each time were most of an idle store worker's CPU).
    create_all_topics(settings)
    topic, parts = topology_of(settings).timers, topology_of(settings).partitions
    reader = LiveReader(settings)
    p = txn_producer(settings)
    try:
        write(p, topic, [(0, b"a", b"1"), (1, b"b", b"1")], commit=True)
        first = reader.read(topic, parts)
        assert first.settled and first.counts == {0: 1, 1: 1, 2: 0, 3: 0}
        assert reader.read(topic, parts) is first  # ends unmoved: not read again
        write(p, topic, [(1, b"b", None), (2, b"c", b"1")], commit=True)
        second = reader.read(topic, parts)  # the same clients read the new ends
        assert second is not first and second.counts == {0: 1, 1: 0, 2: 1, 3: 0}
        write(p, topic, [(3, b"d", b"1")], commit=None)  # open: unsettled, not kept
        third = reader.read(topic, parts, timeout_s=3)
        assert third.unsettled == {3} and reader.read(topic, parts, timeout_s=3) is not third
        p.abort_transaction(30)
        assert reader.read(topic, parts).counts == {0: 1, 1: 0, 2: 1, 3: 0}
    finally:
        reader.close()
