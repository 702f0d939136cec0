"""A fetch worker restarted holding only parked work commits that work (real broker, real
worker processes, real chDB).

The case the last fault runs lost pages on: every frontier record is consumed and most of it
parked when the worker dies; its restart restores the parked queue and consumes no frontier
record at all, so the consumer never has a position (librdkafka reports -1001 until a record
arrives). The results of every job it then takes from disk must still be committed, with the
group's committed offsets, or they are fetched and thrown away while every gauge reads 0.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    report,
    stage_lags,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from infra.live_state import live_entries
from infra.topics import topology_of
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration


def test_a_restart_with_only_parked_work_stores_all_of_it(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    hosts = ("127.0.0.2", "127.0.0.3")
    n = 300  # per host
    s = settings.replace(rate_cap=10.0)  # default lease: a restart under the same id
    port = free_port(hosts, 18820)
    with BehaviourSite(port, {h: Behaviour() for h in hosts}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        urls = [u for h in hosts for u in site.urls(h, n)]
        publish_seeds(s, urls)
        fetch = ws.all["fetch-0"]
        # Every frontier record consumed (most of it parked) and committed: nothing new
        # will reach the restarted worker's consumer.
        wait_until(lambda: fetch.gauge("parked") >= 100 and stage_lags(s)["fetch"] == 0
                   and len(site.pages()) >= 20, 60, "the frontier consumed, most of it parked")
        topo = topology_of(s)
        parked_on_broker = live_entries(s, topo.parked, s.topic_partitions).total
        fetch.kill()
        ws.restart("fetch-0")
        wait_drained(s, ws, 150, lambda: page_counts(s).final >= 2 * n)
        restarted = ws.all["fetch-0"]
        counts = page_counts(s)
        stored = stored_pages(s)
        left = live_entries(s, topo.parked, s.topic_partitions)
    assert parked_on_broker >= 50, parked_on_broker
    assert restarted.counter("unparked") > 0  # it worked from the restored queue
    assert restarted.counter("committed_txns") > 0
    assert counts.final == counts.urls == 2 * n, counts  # nothing fetched and thrown away
    assert set(stored) == set(urls)
    assert left.settled and left.total == 0, left.counts  # the queue is empty on the broker
    report("parked_only_restart", parked_at_kill=parked_on_broker,
           unparked=restarted.counter("unparked"))
