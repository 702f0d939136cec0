"""A partition revoked while its store's restore starts does not fail the others' restore.

Seen in a soak round: fetch was assigned 12 partitions, 6 of them were revoked a moment
later, and the restore thread's start-offset lookup of a dropped one raised ``KeyError``;
the whole restore failed, so the 6 partitions the worker kept stayed paused for 11 s.
"""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import TopicPartition

from consumers.fetch.seen import SeenStore
from streams.state_store import StateStore


class _Watermarks:
    """Answers ``get_watermark_offsets`` as a consumer does: (low, high) of the log."""

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return (0, 40)


def test_a_dropped_partition_of_a_state_store_starts_at_the_end(tmp_path: Path) -> None:
    store = StateStore("parked", tmp_path / "parked")
    for p in (0, 1):
        store.open(p)
    store.drop(0)  # revoked on Kafka's thread while the restore thread looks up starts
    try:
        assert store._start_offset(_Watermarks(), "crawl.parked", 0) == 40  # type: ignore[arg-type]
        assert store._start_offset(_Watermarks(), "crawl.parked", 1) == 0  # type: ignore[arg-type]
    finally:
        store.close()


def test_a_dropped_partition_of_the_seen_store_starts_at_the_end(tmp_path: Path) -> None:
    store = SeenStore.at(tmp_path / "seen")
    for p in (0, 1):
        store.open(p)
    store.drop(0)
    try:
        assert store.store._start_offset(_Watermarks(), "crawl.seen", 0, 30.0) == 40  # type: ignore[arg-type]
        assert store.store._start_offset(_Watermarks(), "crawl.seen", 1, 30.0) == 0  # type: ignore[arg-type]
    finally:
        store.close()
