"""The queue sampler's oldest-waiting read, against the real broker: a partition whose lag
is only a transaction marker has no record to wait for."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer

from consumers.sampler import oldest_reader_conf, oldest_waiting
from core.config import Settings
from infra.topics import create_topics, topology_of
from streams.io import producer_conf


def test_a_lag_of_markers_alone_ends_the_read_without_waiting(settings: Settings) -> None:
    create_topics(settings)
    topic = topology_of(settings).frontier
    producer = Producer(producer_conf(settings, "sampler-test", "sampler-test-txn"))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"waits", partition=0)   # offset 0, its commit marker at 1
    producer.produce(topic, b"handled", partition=1)  # offset 0, its commit marker at 1
    producer.commit_transaction(30)
    reader = Consumer(oldest_reader_conf(settings))
    try:
        # Partition 1's group is past its record: what is left there is the marker alone.
        wait_s = 30.0
        began = time.monotonic()
        oldest = oldest_waiting(reader, {(topic, 0): 0, (topic, 1): 1}, wait_s, lambda: False)
        took = time.monotonic() - began
        assert oldest is not None and oldest > 0  # partition 0's record was read
        # Not the deadline: it returned once partition 1 reached its end (without
        # enable.partition.eof it polled until the deadline).
        assert took < wait_s / 3, took
        # Only markers everywhere: None, again without waiting out the deadline.
        began = time.monotonic()
        assert oldest_waiting(reader, {(topic, 1): 1}, wait_s, lambda: False) is None
        assert time.monotonic() - began < wait_s / 3
        # A stop ends the read at once, whatever is left.
        assert oldest_waiting(reader, {(topic, 2): 0}, wait_s, lambda: True) is None
    finally:
        reader.close()
