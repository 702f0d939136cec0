"""A fetch worker whose session ends in the middle of a rebalance leaves no partition unowned.

When a second fetch worker joins, the group's first round takes partitions from the first
worker (cooperative rebalance), which hands its finished work over and rejoins for the
second round. If its session ends in between -- a commit refused because the generation
moved on while it ran (ILLEGAL_GENERATION), or the hand-over commit itself failing -- and it
rejoins under its static instance id, the coordinator hands it its remaining partitions back
with no second round: the partitions it gave up went to nobody and their targets were never
crawled (seen with two fetch workers started together, stop 37; reproduced here by the
first scenario on e2bebef^). Two fault points bring each case about on purpose:
``stall_offsets`` (a commit's group metadata ages while a member joins) and
``abort_handover``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from fleet_helpers import (
    PageCounts,
    Worker,
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
from sites.demo_server import free_port
from streams.membership import Membership

pytestmark = pytest.mark.integration

HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 10))
N = 40  # pages per host: at 10 requests/s, seconds of work on every partition


@dataclass
class Outcome:
    urls: list[str]
    counts: PageCounts
    stored: dict[str, int]
    dead: int
    alive: bool
    left: int  # fetch-0's leaves before a rejoin
    aborted: int  # fetch-0's aborted transactions


def _join_during(settings: Settings, fleet: Callable[[Settings], Workers], fault: dict[str, str],
                 when: Callable[[Worker], bool], what: str) -> Outcome:
    """fetch-0 (with ``fault``) holds every partition and fetches; fetch-1 joins once
    ``when(fetch-0)``. Returns what the test asserts on."""
    s = settings.replace(rate_cap=10.0)
    lead = Membership(topology_of(s), "fetch").lead
    every = {(lead, p) for p in range(s.topic_partitions)}
    port = free_port(HOSTS, 18870)
    with BehaviourSite(port, {h: Behaviour() for h in HOSTS}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch_0=fault)
        fetch0 = ws.all["fetch-0"]

        def owned() -> set[tuple[str, int]]:
            return set().union(*lead_assignment(s, "fetch").values())

        wait_until(lambda: owned() == every, 60, "fetch-0 to hold every partition")
        urls = [u for h in HOSTS for u in site.urls(h, N)]
        publish_seeds(s, urls)
        wait_until(lambda: when(fetch0), 60, what)
        ws.start("fetch", "fetch-1")
        wait_until(lambda: fetch0.counter("fenced") >= 1, 60, "fetch-0's session to end")
        # Every partition of the group's input has an owner again, well before a session
        # timeout (30 s) could expire anybody.
        wait_until(lambda: owned() == every, 20,
                   f"every partition to be owned again (owners: {lead_assignment(s, 'fetch')}; "
                   f"fetch-0:\n{fetch0.log_tail()}")
        wait_drained(s, ws, 180, lambda: page_counts(s).final >= len(urls))
        return Outcome(urls, page_counts(s), stored_pages(s),
                       int(scalar(s, "SELECT count() FROM dead_letters FINAL")),
                       fetch0.alive() and ws.all["fetch-1"].alive(),
                       fetch0.counter("left_for_rejoin"), fetch0.counter("aborted_txns"))


def _assert_exactly_once(out: Outcome) -> None:
    assert out.alive
    c = out.counts
    assert c.final == c.urls == c.keys == len(out.urls), c
    assert set(out.stored) == set(out.urls)
    assert out.dead == 0


def test_a_commit_refused_by_a_moved_generation_leaves_no_partition_unowned(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    # The 2nd commit with offsets takes its metadata, then stalls 8 s: fetch-1 joins
    # meanwhile and the group's first round completes, so the offsets are refused.
    out = _join_during(settings, fleet,
                       {"CRAWLFLEET_FAULT": "stall_offsets:2", "CRAWLFLEET_FAULT_STALL_S": "8"},
                       lambda w: "stalling stall_offsets" in w.log(),
                       "fetch-0's commit to stall")
    _assert_exactly_once(out)
    assert out.aborted >= 1 and out.left >= 1, out
    report("generation_moved", pages=len(out.urls), left=out.left)


def test_a_failed_hand_over_leaves_no_partition_unowned(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    out = _join_during(settings, fleet, {"CRAWLFLEET_FAULT": "abort_handover"},
                       lambda w: w.counter("committed_txns") >= 3, "fetch-0 to commit")
    _assert_exactly_once(out)
    assert out.left >= 1, out
    report("handover_failure", pages=len(out.urls), left=out.left)
