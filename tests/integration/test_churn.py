"""Availability under churn, on the real broker with real worker processes and default leases:
static membership, incremental rebalances, restores that are complete or refused, and the
control state read before any work.

Every test here uses the default session timeout (30 s), as a user's fleet does.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient
from fleet_helpers import (
    Workers,
    create_all_topics,
    lead_assignment,
    page_counts,
    publish_seeds,
    report,
    wait_drained,
    wait_until,
)

from core.config import Settings
from infra.topics import create_topics, topology_of
from producers import control
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port
from streams.control import cap_key
from streams.io import Encoder, connected_producer, producer_conf
from streams.status import idle_for

pytestmark = pytest.mark.integration

HOST = "127.0.0.2"


def _fetch_parts(ws: Workers, wid: str) -> set[tuple[str, int]]:
    """What the worker's consumer holds, every tier, as it reports it (not derived)."""
    return ws.all[wid].assignment() if wid in ws.all else set()


def _set_caps(s: Settings, targets: list[str], rate: float) -> None:
    """What ``control.set_cap`` writes for each target, through one producer: 400 producers
    one after the other took ~40 s of the test; the topic holds the same records either way
    (a reader's batches are cut by its ``consume`` calls, not by who produced them)."""
    topo = topology_of(s)
    enc = Encoder(topo, "test-caps")
    producer = connected_producer(producer_conf(s, "test-caps"))
    for target in targets:
        out = enc.control(cap_key(target), {"kind": "cap", "target": target, "value": rate,
                                            "text": None, "issued_by": "test"})
        producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers,
                         partition=out.partition)
    assert producer.flush(30) == 0, "cap records not delivered"


def test_a_pause_issued_before_a_worker_starts_is_honoured(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """The pause is the last of many control records: a worker that read only a first batch
    of them would start fetching; it must read the topic to its end first."""
    s = settings.replace(rate_cap=50.0)
    port = free_port((HOST,), 18830)
    with BehaviourSite(port, {HOST: Behaviour()}) as site:
        create_all_topics(s)
        _set_caps(s, [f"127.0.0.{100 + i % 100}:{9000 + i}" for i in range(400)], 5.0)
        control.pause(s)  # settings in force for other targets, then the pause
        urls = site.urls(HOST, 30)
        publish_seeds(s, urls)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        fetch = ws.all["fetch-0"]
        wait_until(lambda: len(_fetch_parts(ws, "fetch-0")) == 2 * s.topic_partitions, 60,
                   "fetch-0 to own every frontier partition")
        wait_until(lambda: fetch.counter("restores") >= 1 and fetch.gauge("restoring") == 0,
                   60, "fetch-0's partitions restored")
        wait_until(lambda: fetch.counter("busy_ticks") == 0 and idle_for(fetch.status()) > 3,
                   30, "fetch-0 idle for a while, paused")
        assert site.pages(HOST) == [], "a paused fleet fetched"
        assert fetch.counter("consumed") == 0
        control.resume(s)
        wait_drained(s, ws, 90, lambda: page_counts(s).final >= len(urls))
    assert page_counts(s).final == len(urls)


def test_a_restarted_worker_restores_only_the_changelog_tail(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """Checkpoints move as committed state is applied: a worker that stops after a crawl
    and comes back reads (next to) nothing of its dedupe changelog, not the whole of it."""
    s = settings.replace(rate_cap=100.0)
    port = free_port((HOST,), 18840)
    n = 60
    with BehaviourSite(port, {HOST: Behaviour()}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        urls = site.urls(HOST, n)
        publish_seeds(s, urls)
        wait_drained(s, ws, 90, lambda: page_counts(s).final >= n)
        fetch = ws.all["fetch-0"]
        first = fetch.counter("seen_restored")
        fetch.stop()
        ws.restart("fetch-0")
        again = ws.all["fetch-0"]
        wait_until(lambda: again.counter("restores") >= 1, 60, "the restart's restore")
        tail = again.counter("seen_restored")
        publish_seeds(s, urls)  # the same URLs again: all known, none fetched twice
        wait_drained(s, ws, 60, lambda: again.counter("skipped_seen") >= n)
        requested = len(site.pages(HOST))
    report("restore_tail", first_start=first, written=n, read_on_restart=tail)
    assert first == 0  # a new worker: nothing to restore
    assert tail < 5, f"the restart re-read {tail} dedupe records of {n} written"
    assert requested == n  # the restored store knew every page


def test_a_restore_that_cannot_complete_keeps_its_partitions_paused(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """With its dedupe changelog unreadable, a worker fetches nothing (a partial store would
    fetch pages again), says so in its log and status, and goes on once the log is back."""
    s = settings.replace(rate_cap=50.0, restore_timeout_s=2.0)
    port = free_port((HOST,), 18850)
    with BehaviourSite(port, {HOST: Behaviour()}) as site:
        create_all_topics(s)
        admin = AdminClient(s.kafka_common())
        admin.delete_topics([topology_of(s).seen])[topology_of(s).seen].result(30)
        urls = site.urls(HOST, 20)
        publish_seeds(s, urls)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        fetch = ws.all["fetch-0"]
        wait_until(lambda: fetch.gauge("restore_failing") == s.topic_partitions, 90,
                   "every partition's restore to fail")
        assert "could not be restored" in fetch.log()
        assert fetch.gauge("restoring") == s.topic_partitions  # counted as holding work
        assert site.pages(HOST) == [], "fetched with a partial dedupe store"
        create_topics(s)  # the changelog is back (empty): the retried restore completes
        wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(urls))
        failures = fetch.counter("restore_failures")
    assert page_counts(s).final == len(urls)
    assert failures >= 1


def test_a_killed_worker_restarted_under_its_id_takes_its_partitions_back(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """Static membership: kill -9 one of two fetch workers and start it again under its id;
    the broker hands it back its own partitions, with no rebalance: the other worker never
    gives up or takes over a partition (with dynamic membership it would take the victim's
    partitions once the session timed out, then give them back)."""
    s = settings.replace(rate_cap=10.0)
    port = free_port((HOST,), 18860)
    hosts = [f"127.0.0.{i}" for i in range(2, 6)]
    with BehaviourSite(port, {h: Behaviour() for h in hosts}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=2)
        survivor, victim = ws.all["fetch-0"], ws.all["fetch-1"]
        wait_until(lambda: len(_fetch_parts(ws, "fetch-0")) == len(_fetch_parts(ws, "fetch-1"))
                   == s.topic_partitions and all(w.counter("restores") >= 1
                                                 and w.gauge("restoring") == 0
                                                 for w in (survivor, victim)),
                   60, "both workers settled, half the partitions each")
        before = _fetch_parts(ws, "fetch-1")
        assigned = survivor.counter("assigned_partitions")
        revoked_before = survivor.counter("revoked_partitions")  # settling moved some
        urls = [u for h in hosts for u in site.urls(h, 40)]
        publish_seeds(s, urls)
        wait_until(lambda: len(site.pages()) >= 20, 60, "the crawl under way")
        victim.kill()
        ws.restart("fetch-1")
        again = ws.all["fetch-1"]
        wait_until(lambda: again.counter("restores") >= 1, 60, "the restarted worker's restore")
        after = _fetch_parts(ws, "fetch-1")
        wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(urls))
        counts = page_counts(s)
        revoked = survivor.counter("revoked_partitions") - revoked_before
        gained = survivor.counter("assigned_partitions") - assigned
    report("static_restart", revoked=revoked, gained=gained, owned=len(before))
    assert after == before  # its own partitions, back
    assert revoked == 0 and gained == 0, "the kill caused a rebalance"
    assert counts.final == counts.urls == len(urls), counts


def test_a_joining_worker_moves_only_the_partitions_it_takes(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """Cooperative rebalancing: when a second fetch worker joins, the first gives up only the
    partitions the newcomer takes (both tiers of each together) and keeps the others; the
    crawl goes on and stores every page once."""
    s = settings.replace(rate_cap=10.0)
    port = free_port((HOST,), 18870)
    hosts = [f"127.0.0.{i}" for i in range(2, 6)]
    with BehaviourSite(port, {h: Behaviour() for h in hosts}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=1)
        first = ws.all["fetch-0"]
        wait_until(lambda: len(_fetch_parts(ws, "fetch-0")) == 2 * s.topic_partitions
                   and first.gauge("restoring") == 0, 60, "fetch-0 owning everything")
        urls = [u for h in hosts for u in site.urls(h, 40)]
        publish_seeds(s, urls)
        wait_until(lambda: len(site.pages()) >= 20, 60, "the crawl under way")
        ws.start("fetch", "fetch-1")
        wait_until(lambda: _fetch_parts(ws, "fetch-1") and ws.all["fetch-1"].counter(
            "restores") >= 1, 60, "fetch-1 to take its share")
        kept = _fetch_parts(ws, "fetch-0")
        taken = _fetch_parts(ws, "fetch-1")
        leads = lead_assignment(s, "fetch")
        lead_kept, lead_taken = leads.get("fetch-0", set()), leads.get("fetch-1", set())
        revoked = first.counter("revoked_partitions")
        wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(urls))
        counts = page_counts(s)
    report("cooperative_join", kept=len(kept), taken=len(taken), revoked=revoked)
    assert kept and taken and not kept & taken
    assert revoked == len(taken)  # exactly what moved, not everything it owned
    for parts, lead in ((kept, lead_kept), (taken, lead_taken)):
        # A partition's tiers never split between workers: each holds every tier of the
        # partitions the coordinator gave it (the lead topic), and nothing else.
        numbers = {p for _, p in lead}
        assert lead and {t for t, _ in lead} == {topology_of(s).frontier}
        assert parts == {(t, p) for t in topology_of(s).inputs("fetch") for p in numbers}
    assert counts.final == counts.urls == len(urls), counts
