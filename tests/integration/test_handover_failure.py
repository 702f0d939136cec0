"""A fetch worker whose hand-over commit fails mid-rebalance leaves no partition without an owner.

When a second fetch worker joins, the first revokes part of its partitions (cooperative
rebalance) and commits its finished work inside the revocation. If that commit fails (the
group's generation moved on: ILLEGAL_GENERATION), its session ends before it rejoined for the
rebalance's second round. A static member that rejoins under its own instance id is handed
its former assignment back and no second round runs: the partitions it gave up went to
nobody, and their targets were never crawled (seen with two fetch workers started together,
stop 37). The ``abort_handover`` fault point makes that commit fail on purpose.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    lead_assignment,
    page_counts,
    publish_seeds,
    report,
    scalar,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from infra.topics import topology_of
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_site import free_port
from streams.membership import Membership

pytestmark = pytest.mark.integration


def test_partitions_revoked_by_a_failed_hand_over_are_owned_again(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    hosts = tuple(f"127.0.0.{i}" for i in range(2, 10))
    n = 40  # per host: at 10 requests/s, seconds of work on every partition
    s = settings.replace(rate_cap=10.0)
    lead = Membership(topology_of(s), "fetch").lead
    every = {(lead, p) for p in range(s.topic_partitions)}
    port = free_port(hosts, 18870)
    with BehaviourSite(port, {h: Behaviour() for h in hosts}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch_0={"CRAWLFLEET_FAULT": "abort_handover"})
        fetch0 = ws.all["fetch-0"]
        owned = lambda: set().union(*lead_assignment(s, "fetch").values())  # noqa: E731
        wait_until(lambda: owned() == every, 60, "fetch-0 to hold every partition")
        urls = [u for h in hosts for u in site.urls(h, n)]
        publish_seeds(s, urls)
        wait_until(lambda: fetch0.counter("committed_txns") >= 3, 60, "fetch-0 to commit")
        ws.start("fetch", "fetch-1")
        wait_until(lambda: fetch0.counter("handover_failures") >= 1, 60,
                   "fetch-0's hand-over commit to fail")
        # Every partition of the group's input has an owner again, without waiting for a
        # session timeout (30 s) to expire anybody.
        wait_until(lambda: owned() == every, 20,
                   f"every partition to be owned again (owners: {lead_assignment(s, 'fetch')}; "
                   f"fetch-0:\n{fetch0.log_tail()}")
        wait_drained(s, ws, 180, lambda: page_counts(s).final >= len(urls))
        counts = page_counts(s)
        stored = stored_pages(s)
        dead = scalar(s, "SELECT count() FROM dead_letters FINAL")
        by_worker = dict(scalar(s, "SELECT groupArray((fetch_worker, c)) FROM (SELECT "
                                   "fetch_worker, count() AS c FROM pages FINAL "
                                   "GROUP BY fetch_worker)"))
        alive = fetch0.alive() and ws.all["fetch-1"].alive()
        left = fetch0.counter("left_for_rejoin")
    assert alive
    assert counts.final == counts.urls == counts.keys == len(urls), counts
    assert set(stored) == set(urls)
    assert dead == 0
    assert left >= 1  # the session that failed its hand-over left the group before rejoining
    report("handover_failure", pages=len(urls), by_worker=by_worker)
