"""A worker fenced out of its group by a newer join of its own id rejoins and goes on.

A static member (``group.instance.id`` = worker id) is fenced when the group takes its id
for a newer join: a restarted worker's, or the worker's own join retried across a whole-
cluster restart (the CI soak round whose store stopped storing, store lag frozen at 1,836
for 150 s while its process ran). librdkafka hands the fenced consumer one fatal error and
then nothing, ever: a stage that only logged consume errors polled a dead consumer forever,
alive, idle and empty by every gauge. Here a real member of each stage, one stage after
the other in one fleet, is fenced by a consumer joining under its id; each stage must drop
its session and rejoin with a new consumer, and the fleet crawl the demo site to the end,
every page stored exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer
from fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    wait_drained,
    wait_until,
)

from core.config import Settings
from infra.topics import topology_of
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite
from streams.io import consumer_conf

pytestmark = pytest.mark.integration


def fence(settings: Settings, stage: str, worker: str) -> None:
    """Join ``stage``'s group as ``worker`` (same static id), until the group has given
    this consumer the partitions: the live worker of that id is fenced from then on."""
    topo = topology_of(settings)
    usurper = Consumer({**consumer_conf(settings, topo.group(stage), worker),
                        "client.id": f"{worker}-usurper"})
    usurper.subscribe(topo.subscription(stage))
    try:
        deadline = time.monotonic() + 60
        while not usurper.assignment():
            assert time.monotonic() < deadline, "the usurper never got an assignment"
            usurper.poll(0.2)
    finally:
        usurper.close()


#: Every stage whose member is fenced, one after the other, in one fleet: each case of its own
#: cost a pipeline's start, a crawl and a stop (~20 s) for the same property.
STAGES = ("fetch", "parse", "store", "retry")


def test_a_worker_fenced_by_a_newer_join_of_its_id_rejoins_and_crawls_on(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    spec = demo_spec(site_port)
    expected = spec.expected()
    create_all_topics(settings)
    ws = fleet(settings)
    with DemoSite(spec):
        ws.start_pipeline()
        ws.wait_store_ready()
        victims = {stage: ws.all[f"{stage}-0"] for stage in STAGES}
        for stage, victim in victims.items():
            wait_until(lambda v=victim: bool(v.assignment()), 60, f"{stage}-0 to own partitions")
            fence(settings, stage, f"{stage}-0")
            wait_until(lambda v=victim: v.counter("fenced") >= 1, 30,
                       f"{stage}-0 to see it was fenced and rejoin\n{victim.log_tail()}")
        publish_seeds(settings, spec.seeds())
        wait_drained(settings, ws, 120, lambda: page_counts(settings).final >= len(expected))
        counts = page_counts(settings)
        assert counts.final == counts.urls == len(expected), (counts, ws.logs())
        for stage, victim in victims.items():
            assert victim.alive(), (stage, victim.log_tail())
            assert "rejoining" in victim.log(), (stage, victim.log_tail())
