"""Aborted transactions lose nothing and apply nothing twice (real broker, real workers, chDB).

Kills are not the only way a commit fails: a slow broker turns a transaction into an
abortable error while the worker lives on. That path used to be followed by another commit
(the revoke callback's as the session closed, or a clean stop's) whose offsets passed the
aborted batch: its results, its parked jobs and its dedupe keys were gone for good. Here every
few commits of the fetch and parse workers abort (``abort_commit`` fault point), on a capped
site whose work is mostly parked, and every page must still be stored exactly once.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    report,
    scalar,
    stored_pages,
    wait_drained,
)

from core.config import Settings
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration


def test_every_page_is_stored_once_while_commits_abort(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    hosts = ("127.0.0.2", "127.0.0.3")
    n = 150  # per host
    s = settings.replace(rate_cap=15.0)
    port = free_port(hosts, 18840)
    with BehaviourSite(port, {h: Behaviour() for h in hosts}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch_0={"CRAWLFLEET_FAULT": "abort_commit:%6"},
                          parse_0={"CRAWLFLEET_FAULT": "abort_commit:%5"})
        urls = [u for h in hosts for u in site.urls(h, n)]
        publish_seeds(s, urls)
        wait_drained(s, ws, 240, lambda: page_counts(s).final >= 2 * n)
        fetch, parse = ws.all["fetch-0"], ws.all["parse-0"]
        aborted = {"fetch": fetch.counter("aborted_txns"), "parse": parse.counter("aborted_txns")}
        rejoins = {"fetch": fetch.counter("fenced"), "parse": parse.counter("fenced")}
        counts = page_counts(s)
        stored = stored_pages(s)
        dead = scalar(s, "SELECT count() FROM dead_letters FINAL")
        requests = collections.Counter((h, p) for _, h, p in site.pages())
        alive = fetch.alive() and parse.alive()
    assert alive  # an aborted commit is survived in-process, never a crash
    assert aborted["fetch"] >= 3 and aborted["parse"] >= 3, aborted
    assert counts.final == counts.urls == counts.keys == 2 * n, counts
    assert set(stored) == set(urls)
    assert dead == 0
    assert len(requests) == 2 * n  # every page asked for; repeats are aborted batches' redo
    # Each failed commit ended its session: nothing more was committed before a rejoin.
    assert rejoins["fetch"] >= aborted["fetch"] and rejoins["parse"] >= aborted["parse"]
    report("aborted_commits", aborted=aborted, rejoins=rejoins,
           requests=sum(requests.values()), pages=2 * n,
           repeated=sum(1 for c in requests.values() if c > 1))
