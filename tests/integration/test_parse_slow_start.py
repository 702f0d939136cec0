"""Parse stage on the real broker: a burst is committed in growing transactions (slow start),
and splitting a batch loses and repeats nothing."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer

from consumers.parse import ParseStage
from core.config import Settings
from infra.topics import topology_of
from producers.frontier import parse_line
from schemas.keys import page_key
from streams.io import Encoder, producer_conf
from streams.slow_start import SlowStart
from streams.worker import StopFlag
from tests.integration.fleet_helpers import (
    committed_offsets,
    create_all_topics,
    key_counts,
    read_topic,
    wait_until,
)

PAGES = 400


class _Recording(SlowStart):
    """The stage's slow start, remembering every committed transaction's size."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def committed(self, size: int, now: float | None = None) -> None:
        self.sizes.append(size)
        super().committed(size, now)


def _publish_results(settings: Settings) -> set[str]:
    """``PAGES`` fetched pages, all visible at once: one burst for the parse stage."""
    enc = Encoder(topology_of(settings), "test")
    producer = Producer(producer_conf(settings, "slow-start-test"))
    keys = set()
    for k in range(PAGES):
        job = parse_line(f"http://127.0.0.{2 + k % 4}:8080/p/{k}.html", settings)
        assert job is not None
        url = job["url"]
        key = page_key(job)
        body = f"<html><title>p{k}</title><body>page {k}</body></html>".encode()
        out = enc.record(topology_of(settings).fetched, job["target"],
                         key.encode(), {"job": job, "final_url": url, "status": 200,
                                        "content_type": "text/html", "body": body,
                                        "fetched_at_ms": int(time.time() * 1000),
                                        "elapsed_ms": 1, "redirects": [], "worker": "test"})
        producer.produce(out.topic, value=out.value, key=out.key, partition=out.partition,
                         headers=out.headers)
        keys.add(key)
    assert producer.flush(30) == 0
    return keys


def test_burst_is_committed_in_growing_transactions_without_loss(settings: Settings) -> None:
    create_all_topics(settings)
    keys = _publish_results(settings)
    topo = topology_of(settings)
    stop = StopFlag()
    stage = ParseStage(settings, "slow-start", stop=stop)
    stage.slow_start = recording = _Recording()
    worker = threading.Thread(target=stage.run, daemon=True)
    worker.start()
    try:
        def all_committed() -> bool:
            done = committed_offsets(settings, "parse", [topo.fetched])
            return sum(max(o, 0) for o in done.values()) >= PAGES
        wait_until(all_committed, 60, "the parse group to commit every fetched page")
    finally:
        stop.set()
        worker.join(timeout=30)
    sizes = [n for n in recording.sizes if n]
    # The burst was split: 50 first, then at most twice the largest before, to the end.
    assert sizes[0] == 50, sizes
    assert len(sizes) >= 3, sizes
    assert all(b <= 2 * max(sizes[:i + 1]) for i, b in enumerate(sizes[1:])), sizes
    assert sum(sizes) == PAGES, sizes
    # Every page reached the parsed topic exactly once, and nothing else did.
    parsed = key_counts(read_topic(settings, topo.parsed))
    assert set(parsed) == keys
    assert set(parsed.values()) == {1}
    # The committed input offsets are the ends of the partitions: nothing left behind.
    ends = {}
    for r in read_topic(settings, topo.fetched):
        ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
    done = committed_offsets(settings, "parse", [topo.fetched])
    assert {tp: o for tp, o in done.items() if tp in ends} == ends
