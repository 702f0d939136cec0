"""Drained means drained: ``crawl``'s drain check and ``top`` read crawl.parked as the
broker holds it, not the workers' gauges (real broker, real worker processes, real chDB).

A parked job is work even when no worker has it in memory (its owner died, or dropped it):
the issue's crawl lost 77 jobs that way while every gauge read 0 and every lag was 0.
Here the fleet drains, then a parked entry appears behind the workers' backs (written by a
transactional producer, as a fetch worker writes them): every gauge still reads 0, and the
drain check must refuse -- also while a transaction that deletes it is open -- until the
entry is gone.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from fleet_helpers import create_all_topics, publish_seeds, query, store_ready, wait_until
from rich.console import Console

from consumers.fetch.parking import park_key
from core.config import Settings
from crawlfleet.crawl import Fleet, _watch
from crawlfleet.top import FleetView, render
from infra.topics import topology_of
from producers.frontier import PublishReport, jobs_from_lines
from schemas.stages import stages
from sites.behaviour_site import Behaviour, BehaviourSite
from streams.io import Encoder
from streams.status import holds_work, read_statuses

pytestmark = pytest.mark.integration

HOST = "127.0.0.2"


def test_the_drain_check_refuses_while_the_broker_holds_a_parked_job(
        settings: Settings, site_port: int, fleet_factory: Callable[..., Fleet]) -> None:
    s = settings
    with BehaviourSite(site_port, {HOST: Behaviour()}) as site:
        create_all_topics(s)
        fleet = fleet_factory(s)
        wait_until(lambda: store_ready(s), 60, "the store worker to serve")
        publish_seeds(s, site.urls(HOST, 6))
        out = io.StringIO()
        console = Console(file=out, width=400)  # not a terminal: plain progress lines
        began = time.monotonic()
        assert _watch(s, fleet, console, 120, began), out.getvalue()
        drained_in = time.monotonic() - began

        topo = topology_of(s)
        (job,) = jobs_from_lines([site.url(HOST, 99)], s, PublishReport())
        entry = Encoder(topo, "test").record(topo.parked, job["target"],
                                             park_key(job["target"], 0, 1 << 40), job)
        producer = Producer({**s.kafka_common(), "transactional.id": f"t-{uuid.uuid4().hex}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(entry.topic, key=entry.key, value=entry.value,
                         partition=entry.partition, headers=entry.headers)
        producer.commit_transaction(30)

        assert not _watch(s, fleet, console, 8, time.monotonic()), out.getvalue()
        # The pipeline's four workers (the quarantine app reports too: analytics, no work)
        statuses = [st for st in read_statuses(s.status_dir) if st["stage"] in stages()]
        assert len(statuses) == 5 and not any(holds_work(st["gauges"]) for st in statuses)
        assert f"the broker holds: crawl.parked 1 live (p{entry.partition} 1)" \
            in out.getvalue(), out.getvalue()

        view = FleetView(s)
        try:
            screen = Console(file=io.StringIO(), width=300, record=True)
            screen.print(render(view.snapshot()))
        finally:
            view.close()
        assert f"held by the broker: crawl.parked 1 live (p{entry.partition} 1)" \
            in screen.export_text()

        # The metrics count it too: the store worker's sampler reads the changelogs every
        # sample_interval_s into its gauges (Prometheus) and the queue_samples table.
        def sampled() -> bool:
            gauges = next(st["gauges"] for st in read_statuses(s.status_dir)
                          if st["stage"] == "store")
            return gauges.get("live_parked") == 1
        wait_until(sampled, 3 * s.sample_interval_s, "the sampler to count the parked job")
        assert query(s, f"SELECT max(lag) FROM queue_samples WHERE stage = 'fetch' "
                        f"AND topic = '{topo.parked}'") == [[1]]

        # Its tombstone in a transaction still open: unsettled, not drained either.
        producer.begin_transaction()
        producer.produce(entry.topic, key=entry.key, value=None, partition=entry.partition)
        producer.flush(30)
        assert not _watch(s, fleet, console, 6, time.monotonic()), out.getvalue()
        assert f"open transaction on p{entry.partition}" in out.getvalue()
        producer.commit_transaction(30)

        began = time.monotonic()
        assert _watch(s, fleet, console, 30, began), out.getvalue()
        settled_in = time.monotonic() - began
    print(f"\nFAULT-REPORT drain-held-work: drained_s={drained_in:.1f} "
          f"drained_after_tombstone_s={settled_in:.1f}")
