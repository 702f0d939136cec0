"""Fault tests: the reference failure scenarios of DESIGN.md, on real parts.

Real broker, real worker processes (``crawlfleet worker STAGE``), real chDB store, loopback
sites that count every request. Each test breaks one thing on purpose (a frozen worker, a
worker killed right after a side effect, a skewed clock, poison input) and then checks, from
the store, the topics (read_committed) and the site's own request counters, that no stored
result was applied twice and nothing was lost. Measured figures are printed as
``FAULT-REPORT`` lines (``pytest -s`` shows them).
"""

from __future__ import annotations

import collections
import contextlib
import re
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from fleet_helpers import (
    SKEWED_CLOCK_BOOT,
    CountingServer,
    Workers,
    committed_offsets,
    create_all_topics,
    describe_fetch_results,
    group_assignment,
    key_counts,
    page_counts,
    publish_seeds,
    query,
    query_offline,
    read_topic,
    report,
    scalar,
    stage_lags,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from infra.topics import topology_of
from schemas.topics import HEADER_SCHEMA, Topology, partition_for
from sites.bench_site import bench_spec
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite, free_port

pytestmark = pytest.mark.integration

#: A short broker-judged lease keeps the tests fast; the freeze outlasts it with margin.
LEASE_MS = 6000
FENCE_LOG = re.compile(r"fenced|rejoin|commit on revoke failed", re.IGNORECASE)




def _page_requests(requests: collections.Counter[str]) -> collections.Counter[str]:
    return collections.Counter({u: n for u, n in requests.items()
                                if not u.endswith("/robots.txt")})


def _ratio(requests: collections.Counter[str]) -> float:
    return round(sum(requests.values()) / max(1, len(requests)), 3)


def _exactly_once_problems(settings: Settings, expected: dict[str, int],
                           fetched: collections.Counter[str] | None = None) -> list[str]:
    """Every way the store (and the committed FetchResults) differ from "each page once"."""
    problems = []
    counts = page_counts(settings)
    if not counts.final == counts.urls == counts.keys == len(expected):
        problems.append(f"store counts {counts} != {len(expected)} expected pages")
    stored = stored_pages(settings)
    missing = sorted(set(expected) - set(stored))
    if missing:
        problems.append(f"{len(missing)} pages never stored (lost): {missing[:20]}")
    extra = sorted(set(stored) - set(expected))
    if extra:
        problems.append(f"{len(extra)} unexpected pages stored: {extra[:20]}")
    wrong = {u: (stored[u], expected[u]) for u in stored if u in expected
             and stored[u] != expected[u]}
    if wrong:
        problems.append(f"pages stored with the wrong status (got, want): {wrong}")
    if fetched is not None:
        dupes = {k: n for k, n in fetched.items() if n > 1}
        if dupes:
            problems.append(f"{len(dupes)} pages with duplicate committed FetchResults: {dupes}")
    return problems


def _assert_stored_exactly_once(settings: Settings, expected: dict[str, int]) -> None:
    problems = _exactly_once_problems(settings, expected)
    assert not problems, "\n".join(problems)


def _bench_site(hosts: int, start_port: int) -> tuple[list[str], int]:
    ips = [f"127.0.0.{2 + k}" for k in range(hosts)]
    return ips, free_port(ips, start_port)


# --- 1. stolen lease ---------------------------------------------------------------------------


SLOW_S = 25.0


def _hosts_in_partitions(partitions: list[int], count: int, taken: list[str]) -> list[str]:
    """Loopback IPs (not in ``taken``) whose targets land in ``partitions``, in that order."""
    out = []
    for want in partitions:
        out.append(next(ip for ip in (f"127.0.0.{x}" for x in range(6, 250))
                        if ip not in taken and ip not in out
                        and partition_for(ip, count) == want))
    return out


def _provisioned(s: Settings,
                 fleet: Callable[[Settings], Workers]) -> tuple[Topology, Workers, float]:
    """Topics created for ``s``, a worker fleet for it, and the time the test's crawl starts."""
    create_all_topics(s)
    return topology_of(s), fleet(s), time.monotonic()


def test_stolen_lease_zombie_commit_is_fenced(settings: Settings,
                                              fleet: Callable[[Settings], Workers]) -> None:
    """A frozen fetch worker loses its lease; the survivor takes over and commits; the
    zombie's late commit is rejected and nothing it produced reaches read_committed readers.

    A slow page heads each of the zombie's partitions, as a slow target does in real crawls:
    it holds the partition's commit point back, so the zombie's transactions keep carrying
    outputs while their input offsets cannot advance. Fencing must not depend on offsets
    moving.
    """
    s0 = settings.replace(session_timeout_ms=LEASE_MS, rate_cap=20.0, scope="seeds",
                          request_timeout_s=SLOW_S + 15)
    bench_ips = [f"127.0.0.{2 + k}" for k in range(4)]
    # A slow host for every partition: the ones the zombie turns out to own get a slow page
    # (the cooperative-sticky assignor does not promise which two partitions each gets).
    slow_ips = _hosts_in_partitions(list(range(s0.topic_partitions)), s0.topic_partitions,
                                    bench_ips)
    port = free_port(bench_ips + slow_ips, 18700)
    spec = bench_spec(port, pages=300, hosts=4, page_bytes=4000)
    s = s0.replace(allowed_targets=bench_ips + slow_ips)
    slow_body = b"<html><head><title>Slow</title></head><body><p>slow</p></body></html>"
    every_slow = [CountingServer(ip, port, {"/slow.html": (200, slow_body)},
                                 {"/slow.html": SLOW_S}) for ip in slow_ips]
    topo, ws, started = _provisioned(s, fleet)
    with DemoSite(spec) as site, contextlib.ExitStack() as stack:
        for server in every_slow:
            stack.enter_context(server)
        ws.start_pipeline(fetch=2)
        wait_until(lambda: len([m for m, tps in group_assignment(s, "fetch").items() if tps])
                   == 2, 60, "both fetch workers to own partitions")
        zombie_id = next(m for m, tps in group_assignment(s, "fetch").items()
                         if (topo.frontier, 0) in tps)
        zombie = ws.all[zombie_id]
        survivor = ws.all["fetch-1" if zombie_id == "fetch-0" else "fetch-0"]
        zombie_parts = {p for _, p in group_assignment(s, "fetch")[zombie_id]}
        assert len(zombie_parts) == s.topic_partitions // 2, zombie_parts
        slow_sites = [every_slow[p] for p in sorted(zombie_parts)]
        slow_urls = [site.url("/slow.html") for site in slow_sites]
        expected = {**spec.expected(), **dict.fromkeys(slow_urls, 200)}
        publish_seeds(s, slow_urls + spec.seeds())  # the slow pages first: oldest in flight

        wait_until(lambda: zombie.counter("fetched") >= 20
                   and zombie.gauge("inflight") + zombie.gauge("queued") > 1,
                   60, f"{zombie_id} to have work in flight")
        zombie.freeze()
        frozen_at, frozen_wall = time.monotonic(), time.time()
        fetched_at_freeze = zombie.counter("fetched")
        all_parts = {(t, p) for t in (topo.frontier, topo.frontier_high)
                     for p in range(s.topic_partitions)}
        wait_until(lambda: group_assignment(s, "fetch") == {survivor.wid: all_parts},
                   LEASE_MS / 1000 + 20, "the group to move every partition to the survivor")
        moved_after = time.monotonic() - frozen_at
        commits = survivor.counter("committed_txns")
        wait_until(lambda: survivor.counter("committed_txns") > commits, 20,
                   "the survivor to commit as the new owner")
        # Stay frozen well past the lease while the survivor works through the partitions,
        # so the zombie wakes up holding work the new owner has already redone.
        time.sleep(max(0.0, LEASE_MS / 1000 + 8 - (time.monotonic() - frozen_at)))
        frozen_for = time.monotonic() - frozen_at
        zombie.thaw()

        wait_until(lambda: zombie.counter("fenced") > 0 or FENCE_LOG.search(zombie.log()),
                   40, f"{zombie_id} to be fenced out (status counter or log)")
        drain_s = wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(expected))
        requests, _ = site.snapshot()
        for slow in slow_sites:
            requests[slow.url("/slow.html")] = slow.count("/slow.html")

        counts = page_counts(s)
        fetched_records = read_topic(s, topo.fetched)
        fetched = key_counts(fetched_records)
        # Stored once each, and one committed FetchResult per page for read_committed readers
        # (no output of the zombie's became visible after the survivor redid its work).
        problems = _exactly_once_problems(s, expected, fetched)
        dupes = {k: n for k, n in fetched.items() if n > 1}
        # The weaker form: a repeated key must at least have been fetched that often.
        unexplained = {k: n for k, n in dupes.items() if requests[k.split("|", 1)[1]] < n}
        if unexplained:
            problems.append(f"committed duplicates never even re-fetched: {unexplained}")
        assert not problems, "\n".join([
            f"froze {zombie_id} at {frozen_wall:.3f} for {frozen_for:.1f}s; slow pages "
            f"requested {[x.count('/slow.html') for x in slow_sites]} times",
            *problems, *describe_fetch_results(fetched_records, dupes), ws.logs()])

        fenced = zombie.counter("fenced")
        fence_lines = [ln for ln in zombie.log().splitlines() if FENCE_LOG.search(ln)]
        assert fenced > 0 or fence_lines
        assert zombie.alive(), f"the zombie must rejoin, not die:\n{zombie.log_tail()}"
        wait_until(lambda: len(group_assignment(s, "fetch")) == 2, 30,
                   "the former zombie to rejoin the group")

    pages = _page_requests(requests)
    report("stolen_lease", pages=len(expected), stored_final=counts.final, stored_raw=counts.raw,
           fetch_requests=sum(pages.values()), fetch_over_apply=_ratio(pages),
           store_over_apply=round(counts.final / len(expected), 3),
           refetched_pages=sum(1 for n in pages.values() if n > 1),
           zombie_fetched_before_freeze=fetched_at_freeze, frozen_s=round(frozen_for, 1),
           partitions_moved_after_s=round(moved_after, 1), zombie_fenced_counter=fenced,
           zombie_fence_log=[ln[:160] for ln in fence_lines[:3]], drain_s=round(drain_s, 1),
           total_s=round(time.monotonic() - started, 1))


REBALANCE_SLOW_S = 20.0


def test_rebalance_mid_fetch_loses_nothing(settings: Settings,
                                           fleet: Callable[[Settings], Workers]) -> None:
    """A second fetch worker joins while a slow fetch is in flight (the everyday lease move:
    scale-out). Rebalances are incremental: the slow page's partition either stays with its
    owner (its fetch goes on) or moves (its new owner redoes it, the old one's result is
    dropped); either way the job is stored exactly once, never skipped as "in flight"."""
    s0 = settings.replace(request_timeout_s=REBALANCE_SLOW_S + 15)
    # fetch-0 sorts first, so it owns partitions 0 and 1 before and after fetch-1 joins.
    slow_ip = _hosts_in_partitions([0], s0.topic_partitions, [])[0]
    port = free_port([slow_ip], 19300)
    body = b"<html><head><title>Slow</title></head><body><p>slow</p></body></html>"
    with CountingServer(slow_ip, port, {"/slow.html": (200, body)},
                        {"/slow.html": REBALANCE_SLOW_S}) as site:
        slow = site.url("/slow.html")
        s = s0.replace(allowed_targets=[slow_ip])
        topo, ws, started = _provisioned(s, fleet)
        ws.start_pipeline(fetch=1)
        publish_seeds(s, [slow])
        wait_until(lambda: site.count("/slow.html") == 1, 60, "the slow fetch to start")
        ws.start("fetch", "fetch-1")
        wait_until(lambda: len([m for m, tps in group_assignment(s, "fetch").items() if tps])
                   == 2, 60, "both fetch workers to own partitions")
        moved_at = time.monotonic()
        kept = (topo.frontier, 0) in group_assignment(s, "fetch")["fetch-0"]
        in_flight_for = moved_at - site.first_at["/slow.html"]
        assert in_flight_for < REBALANCE_SLOW_S - 2, (
            f"precondition: the rebalance took {in_flight_for:.1f}s, the slow fetch was no "
            "longer in flight (machine too loaded?)")
        drain_s = wait_drained(s, ws, 90, lambda: page_counts(s).final >= 1)
        fetched = key_counts(read_topic(s, topo.fetched))
        problems = _exactly_once_problems(s, {slow: 200}, fetched)
        assert not problems, "\n".join([*problems, f"slow page requested "
                                         f"{site.count('/slow.html')} times", ws.logs()])
        assert site.count("/slow.html") <= 2
    report("rebalance_mid_fetch", slow_partition_kept=kept,
           slow_requests=site.count("/slow.html"),
           rebalanced_after_s=round(in_flight_for, 1), drain_s=round(drain_s, 1),
           total_s=round(time.monotonic() - started, 1))


# --- 2. lost ack -------------------------------------------------------------------------------


def test_lost_ack_store_replay_is_suppressed(settings: Settings, site_port: int,
                                             fleet: Callable[[Settings], Workers]) -> None:
    """The store inserts a batch and dies before committing its offsets; the restarted store
    replays it, and the insert token / ReplacingMergeTree key keep every row once."""
    spec = demo_spec(site_port)
    expected = spec.expected()
    s = settings.replace(rate_cap=5.0)
    topo, ws, started = _provisioned(s, fleet)
    with DemoSite(spec):
        ws.start_pipeline(store_0={"CRAWLFLEET_FAULT": "after_insert:2"})
        publish_seeds(s, spec.seeds())
        store = ws.all["store-0"]
        rc = store.wait_exit(90)
        assert rc == 137 and "dying at after_insert #2" in store.log(), store.log_tail()

        # While no store runs: what did the dead store insert beyond its committed offsets?
        committed = committed_offsets(s, "store", [topo.parsed, topo.telemetry, topo.dead])
        inserted = query_offline(s, "SELECT event_id FROM fetch_events UNION ALL "
                                    "SELECT event_id FROM dead_letters")
        unacked = sorted(str(e) for (e,) in inserted
                         if _offset_of(str(e)) >= committed.get(_tp_of(str(e)), -1))
        raw_before = int(query_offline(s, "SELECT count() FROM pages")[0][0])
        assert unacked or raw_before, "the store died before inserting anything"

        ws.restart("store-0")
        ws.wait_store_ready()
        drain_s = wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(expected))

        _assert_stored_exactly_once(s, expected)
        counts = page_counts(s)
        assert counts.raw >= counts.final
        # Telemetry and dead letters (keyed by source offset) are exactly once too: an
        # attempt's event is a telemetry record, or rides in its page's parsed record.
        telemetry = read_topic(s, topo.telemetry)
        pages = read_topic(s, topo.parsed)
        dead = read_topic(s, topo.dead)
        events_final, events_raw = query(s, "SELECT (SELECT count() FROM fetch_events FINAL), "
                                            "(SELECT count() FROM fetch_events)")[0]
        dead_final = scalar(s, "SELECT count() FROM dead_letters FINAL")
        assert int(events_final) == len(telemetry) + len(pages)
        assert int(dead_final) == len(dead)
        # The rows the dead store inserted without acking were replayed, yet stored once.
        ids = ",".join(f"'{e}'" for e in unacked) or "''"
        replayed = scalar(s, f"SELECT (SELECT count() FROM fetch_events FINAL WHERE event_id "
                             f"IN ({ids})) + (SELECT count() FROM dead_letters FINAL WHERE "
                             f"event_id IN ({ids}))")
        assert int(replayed) == len(unacked)

    report("lost_ack_store", pages=len(expected), stored_final=counts.final,
           stored_raw=counts.raw, events_final=events_final, events_raw=events_raw,
           unacked_rows_at_crash=len(unacked), pages_raw_at_crash=raw_before,
           store_over_apply=round(counts.final / len(expected), 3), drain_s=round(drain_s, 1),
           total_s=round(time.monotonic() - started, 1))


def _tp_of(event_id: str) -> tuple[str, int]:
    topic, partition, _ = event_id.partition("#")[0].rsplit(":", 2)
    return topic, int(partition)


def _offset_of(event_id: str) -> int:
    """The offset of the record a row came from (``topic:partition:offset``, then
    ``#attempt`` for the attempt a parsed page carries)."""
    return int(event_id.partition("#")[0].rsplit(":", 1)[1])


def test_lost_ack_fetch_commit_is_not_redone(settings: Settings, site_port: int,
                                             fleet: Callable[[Settings], Workers]) -> None:
    """The fetch worker commits a transaction and dies before acting on it; restarted with
    the same id, it restores the committed dedupe state and never refetches that work."""
    spec = demo_spec(site_port)
    expected = spec.expected()
    s = settings.replace(rate_cap=5.0)
    topo, ws, started = _provisioned(s, fleet)
    with DemoSite(spec) as site:
        ws.start_pipeline(fetch_0={"CRAWLFLEET_FAULT": "after_commit:8"})
        publish_seeds(s, spec.seeds())
        fetch = ws.all["fetch-0"]
        rc = fetch.wait_exit(90)
        assert rc == 137 and "dying at after_commit #8" in fetch.log(), fetch.log_tail()
        time.sleep(0.5)  # let the site finish answering requests already sent
        before, _ = site.snapshot()
        committed_before = {(r.key or b"").decode().split("|", 1)[1]
                            for r in read_topic(s, topo.fetched)}
        assert committed_before, "the fault fired before any page was committed"

        ws.restart("fetch-0")
        drain_s = wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(expected))
        after, _ = site.snapshot()

        _assert_stored_exactly_once(s, expected)
        fetched_records = read_topic(s, topo.fetched)
        fetched = key_counts(fetched_records)
        dupes = {k: n for k, n in fetched.items() if n > 1}
        assert not dupes, describe_fetch_results(fetched_records, dupes)

    pages_before, pages_after = _page_requests(before), _page_requests(after)
    post = pages_after - pages_before
    # Work committed before the crash (the lost ack) is never requested again.
    redone = {u: n for u, n in post.items() if u in committed_before}
    assert not redone, f"committed pages fetched again after the restart: {redone}"
    # Every other repeat is a fetch that was in flight, uncommitted, when the worker died
    # (or the flaky page's own retries): at most one request per page beyond those.
    in_flight = {u for u in pages_before if u not in committed_before}
    over = {u: n for u, n in pages_after.items()
            if n > 1 and "flaky" not in u and not (u in in_flight and n == 2)}
    assert not over, f"pages requested more than once: {over}"
    flaky = {u: n for u, n in pages_after.items() if "flaky" in u}
    assert all(n == 3 for n in flaky.values()), flaky
    report("lost_ack_fetch", pages=len(expected), committed_before_crash=len(committed_before),
           requested_before_crash=len(pages_before),
           inflight_refetched=sum(1 for u in in_flight if pages_after[u] > 1 and "flaky" not in u),
           committed_refetched=len(redone), fetch_requests=sum(pages_after.values()),
           fetch_over_apply=_ratio(pages_after),
           robots_requests=sum(n for u, n in after.items() if u.endswith("/robots.txt")),
           drain_s=round(drain_s, 1), total_s=round(time.monotonic() - started, 1))


# --- 3. overrun --------------------------------------------------------------------------------


def test_overrun_lone_worker_commit_rejected_and_redone(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """The only fetch worker runs past its lease (frozen); nobody takes over; when it wakes,
    its stale commit is rejected, it rejoins, and the next owner (itself) redoes the jobs,
    including a slow fetch that was still in flight when the lease ran out."""
    ips, port = _bench_site(3, 18900)
    s0 = settings.replace(session_timeout_ms=LEASE_MS, rate_cap=5.0, scope="seeds",
                          request_timeout_s=SLOW_S + 15)
    slow_ip = _hosts_in_partitions([0], s0.topic_partitions, ips)[0]
    port = free_port([*ips, slow_ip], port)
    spec = bench_spec(port, pages=200, hosts=3, page_bytes=4000)
    s = s0.replace(allowed_targets=[*ips, slow_ip])
    body = b"<html><head><title>Slow</title></head><body><p>slow</p></body></html>"
    slow_site = CountingServer(slow_ip, port, {"/slow.html": (200, body)}, {"/slow.html": SLOW_S})
    slow = slow_site.url("/slow.html")
    expected = {**spec.expected(), slow: 200}
    topo, ws, started = _provisioned(s, fleet)
    with DemoSite(spec) as site, slow_site:
        ws.start_pipeline(fetch=1)
        publish_seeds(s, [slow, *spec.seeds()])
        worker = ws.all["fetch-0"]
        wait_until(lambda: worker.counter("fetched") >= 10
                   and worker.gauge("inflight") + worker.gauge("queued") > 1
                   and slow_site.count("/slow.html") == 1,
                   60, "the fetch worker to have work in flight, the slow page included")
        worker.freeze()
        frozen_at = time.monotonic()
        fetched_at_freeze = worker.counter("fetched")
        wait_until(lambda: not group_assignment(s, "fetch"), LEASE_MS / 1000 + 20,
                   "the broker to expire the frozen worker's lease (empty group)")
        expired_after = time.monotonic() - frozen_at
        time.sleep(max(0.0, LEASE_MS / 1000 + 3 - (time.monotonic() - frozen_at)))
        frozen_for = time.monotonic() - frozen_at
        worker.thaw()

        wait_until(lambda: worker.counter("fenced") > 0 or FENCE_LOG.search(worker.log()),
                   40, "the overrun worker to be fenced out (status counter or log)")
        drain_s = wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(expected))
        requests, _ = site.snapshot()
        requests[slow] = slow_site.count("/slow.html")

        counts = page_counts(s)
        fetched_records = read_topic(s, topo.fetched)
        fetched = key_counts(fetched_records)
        problems = _exactly_once_problems(s, expected, fetched)
        dupes = {k: n for k, n in fetched.items() if n > 1}
        assert not problems, "\n".join([
            f"slow page requested {requests[slow]} times", *problems,
            *describe_fetch_results(fetched_records, dupes), ws.logs()])
        assert requests[slow] <= 2
        assert worker.alive() and worker.starts == 1, worker.log_tail()
        fence_lines = [ln for ln in worker.log().splitlines() if FENCE_LOG.search(ln)]

    pages = _page_requests(requests)
    report("overrun", pages=len(expected), stored_final=counts.final, stored_raw=counts.raw,
           fetch_requests=sum(pages.values()), fetch_over_apply=_ratio(pages),
           store_over_apply=round(counts.final / len(expected), 3),
           refetched_pages=sum(1 for n in pages.values() if n > 1),
           slow_page_requests=requests[slow],
           fetched_before_freeze=fetched_at_freeze, frozen_s=round(frozen_for, 1),
           lease_expired_after_s=round(expired_after, 1),
           fenced_counter=worker.counter("fenced"), fence_log=[ln[:160] for ln in fence_lines[:3]],
           drain_s=round(drain_s, 1), total_s=round(time.monotonic() - started, 1))


# --- 4. clock skew -----------------------------------------------------------------------------

SKEW_S = 37


def _crawl_demo(s: Settings, port: int, ws: Workers,
                skewed_env: dict[str, str] | None) -> tuple[collections.Counter[str], float]:
    """Crawl the demo site with fetch and retry workers on a skewed clock (if given)."""
    spec = demo_spec(port)
    create_all_topics(s)
    boot = SKEWED_CLOCK_BOOT if skewed_env else None
    with DemoSite(spec) as site:
        ws.start("store", "store-0")
        ws.start("parse", "parse-0")
        ws.start("retry", "retry-0", env=skewed_env, boot=boot)
        ws.start("fetch", "fetch-0", env=skewed_env, boot=boot)
        ws.wait_store_ready()
        publish_seeds(s, spec.seeds())
        wait_drained(s, ws, 120, lambda: page_counts(s).final >= len(spec.expected()))
        _assert_stored_exactly_once(s, spec.expected())
        skew = ws.all["fetch-0"].status().get("wall", time.time()) - time.time()
        requests, _ = site.snapshot()
    ws.close()
    return requests, skew


def test_clock_skew_changes_nothing(settings: Settings, site_port: int,
                                    fleet: Callable[[Settings], Workers]) -> None:
    """Fetch and retry workers whose wall clock is 37 s ahead, on a 30 s lease: the crawl
    stores every page exactly once and the site sees the same requests as without skew."""
    started = time.monotonic()
    base = settings.replace(session_timeout_ms=30_000)
    skewed = base.replace(topic_prefix=base.topic_prefix + "skew.",
                          data_dir=base.data_dir / "skew")

    plain_requests, plain_skew = _crawl_demo(base, site_port, fleet(base), None)
    plain_s = time.monotonic() - started
    skew_requests, skew = _crawl_demo(skewed, site_port, fleet(skewed),
                                      {"CRAWLFLEET_CLOCK_SKEW_S": str(SKEW_S)})

    assert abs(plain_skew) < 5, plain_skew
    assert SKEW_S - 5 < skew < SKEW_S + 5, f"the fetch worker's clock was not skewed: {skew}"
    assert skew_requests == plain_requests
    pages = _page_requests(skew_requests)
    assert all(n == 1 for u, n in pages.items() if "flaky" not in u)
    assert [n for u, n in pages.items() if "flaky" in u] == [3]
    assert all(n == 1 for u, n in skew_requests.items() if u.endswith("/robots.txt"))
    # The skew is real where it shows: pages say they were fetched after they were stored.
    ahead = query_offline(skewed, "SELECT countIf(fetched_at > stored_at + 20), count() "
                                  "FROM pages FINAL")[0]
    assert int(ahead[0]) == int(ahead[1]) > 0, f"fetch times not skewed: {ahead}"
    report("clock_skew", skew_s=round(skew, 1), pages=len(pages),
           fetch_requests=sum(pages.values()), fetch_over_apply=_ratio(pages),
           baseline_s=round(plain_s, 1), total_s=round(time.monotonic() - started, 1))


# --- 5. poison ---------------------------------------------------------------------------------

POISON_HOST = "127.0.0.9"


def test_poison_dead_letters_without_looping(settings: Settings,
                                             fleet: Callable[[Settings], Workers]) -> None:
    """An undecodable frontier record dead-letters at once; a URL that always answers 500 is
    tried exactly max_attempts times, then dead-lettered; neither blocks its partition."""
    port = free_port((POISON_HOST,), 19100)
    ok_body = b"<html><head><title>Fine</title></head><body><p>fine</p></body></html>"
    s = settings.replace(max_attempts=3)
    topo, ws, started = _provisioned(s, fleet)
    with CountingServer(POISON_HOST, port, {"/always500.html": (500, b"boom"),
                                            "/ok.html": (200, ok_body)}) as site:
        bad, ok = site.url("/always500.html"), site.url("/ok.html")
        ws.start_pipeline()
        partition = partition_for(POISON_HOST, s.topic_partitions)
        poison = b"\x00\x01 this is not avro \xff\xfe"
        poison_key = f"{POISON_HOST}|default|{site.url('/poison')}".encode()
        p = Producer(s.kafka_common())
        p.produce(topo.frontier, value=poison, key=poison_key, partition=partition,
                  headers=[(HEADER_SCHEMA, b"0123456789abcdef")])
        assert p.flush(10) == 0
        publish_seeds(s, [bad, ok])

        def dead_reasons() -> dict[str, int]:
            return {str(r): int(n) for r, n in query(
                s, "SELECT reason, count() FROM dead_letters FINAL GROUP BY reason")}

        wait_until(lambda: dead_reasons().get("http_500") and page_counts(s).final == 1,
                   90, "the 500 page to be dead-lettered and the good page stored")
        drain_s = wait_drained(s, ws, 60)
        time.sleep(3)  # nothing may come back after the pipeline went quiet
        assert site.count("/always500.html") == s.max_attempts
        assert site.count("/ok.html") == 1
        assert stored_pages(s) == {ok: 200}

        dead = query(s, "SELECT reason, url, source_topic, attempts, raw FROM dead_letters "
                        "FINAL ORDER BY reason")
        assert [(r[0], r[1], r[2], int(r[3])) for r in dead] == [
            ("http_500", bad, topo.frontier, 3),
            ("undecodable", "", topo.frontier, 1),
        ]
        assert dead[1][4] == poison.hex()
        events = query(s, "SELECT attempt, status, outcome, reason FROM fetch_events FINAL "
                          f"WHERE url = '{bad}' ORDER BY attempt")
        assert [tuple(e) for e in events] == [(0, 500, "retry", "http_500"),
                                              (1, 500, "retry", "http_500"),
                                              (2, 500, "dead", "http_500")]
        # No retry, ever, for the undecodable record; the 500 page went round exactly twice.
        retried = key_counts(r for t in topo.retry_topics for r in read_topic(s, t))
        assert retried == {f"{POISON_HOST}|default|{bad}": 2}
        frontier = key_counts(read_topic(s, topo.frontier))
        assert frontier[poison_key.decode()] == 1
        assert frontier[f"{POISON_HOST}|default|{bad}"] == 3  # seed + 2 re-enqueued retries
        assert all(w.alive() for w in ws.all.values()), ws.logs()
        assert stage_lags(s) == {"fetch": 0, "parse": 0, "store": 0, "retry": 0, "revisit": 0}

    report("poison", requests_500=site.count("/always500.html"), dead_letters=len(dead),
           drain_s=round(drain_s, 1), total_s=round(time.monotonic() - started, 1))
