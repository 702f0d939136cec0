"""Per-target scheduling on the real broker: no target's trouble stalls another.

Each test serves loopback hosts that each behave one way (see ``behaviour_site``), runs the
real stage processes, and referees at the site: which host got how many requests, when,
and how many it had open at once. No timed assertions: orderings, counts, and ratios
between runs of the same test with generous margins.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from core.config import Settings
from crawlfleet.crawl import Fleet
from producers.frontier import publish
from schemas.topics import partition_for
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port
from streams.status import read_statuses
from tests.integration.fleet_helpers import query, store_ready, wait_until

pytestmark = pytest.mark.integration




def _hosts(first: int, n: int) -> list[str]:
    return [f"127.0.0.{i}" for i in range(first, first + n)]


def _port(hosts: list[str]) -> int:
    return free_port(tuple(hosts), 18700)


def _fetch_gauges(s: Settings) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in read_statuses(s.status_dir):
        if st["stage"] == "fetch":
            for k, v in st.get("gauges", {}).items():
                out[k] = out.get(k, 0) + int(v)
    return out


def _stored(s: Settings, host: str) -> int:
    if not store_ready(s):
        return 0
    return int(query(s, f"SELECT count() FROM pages FINAL WHERE target = '{host}'")[0][0])


def test_small_targets_finish_while_a_big_capped_one_runs(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    """The skewed broad crawl: one big site's whole URL list (more than a worker may buffer)
    is published before 20 small sites' seeds, every site at the default cap of 2 req/s."""
    big, small = "127.0.0.2", _hosts(3, 20)
    per_small = 6
    s = settings.replace(rate_cap=2.0)
    assert s.max_buffered < 6000  # without per-target shares the big site fills the worker
    port = _port([big, *small])
    with BehaviourSite(port, {h: Behaviour() for h in [big, *small]}) as site:
        fleet_factory(s)
        publish(site.urls(big, 6000), s)
        publish([u for h in small for u in site.urls(h, per_small)], s)
        wait_until(lambda: all(len(site.pages(h)) >= per_small for h in small), 180,
                   "every small site to be crawled")
        done_at = max(site.pages(h)[-1][0] for h in small)
        big_pages = site.pages(big)
        started = big_pages[0][0] if big_pages else done_at
        gauges = wait_until(lambda: (g := _fetch_gauges(s)) and g.get("parked", 0) and g, 30,
                            "the fetch worker's gauges")
    big_then = sum(1 for t, _, _ in big_pages if t <= done_at)
    # The small sites' own bound: their pages at 2 req/s (they run side by side).
    bound = per_small / 2.0
    took = done_at - min(started, *(site.pages(h)[0][0] for h in small))
    assert took <= 6 * bound, (took, bound)  # generous: start-up, robots.txt, commits
    assert big_then < 0.05 * 6000, big_then  # the big site was still running, as it should
    # Memory stayed bounded: the big site's work waits on disk, not in the worker.
    assert gauges["queued"] + gauges["inflight"] < 300, gauges
    assert gauges["parked"] >= 6000 - big_then - 300, gauges
    for h in small:  # and nobody was hit above the cap (plus the declared burst of 1)
        times = [t for t, _, _ in site.pages(h)]
        assert all(b - a >= 0.99 for a, b in zip(times, times[3:], strict=False)), h


def test_a_flaky_page_slows_its_site_but_never_halts_it(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    """3% of pages answer 503 once: throughput stays close to the same site without them."""
    hosts, per_host = _hosts(2, 4), 150
    port = _port(hosts)
    took: dict[str, float] = {}
    for name, every in (("clean", 0), ("flaky", 33)):
        s = settings.replace(topic_prefix=f"{settings.topic_prefix}{name}.", rate_cap=1000.0)
        with BehaviourSite(port, {h: Behaviour(flaky_every=every) for h in hosts}) as site:
            fleet = fleet_factory(s)
            publish([u for h in hosts for u in site.urls(h, per_host)], s)
            firsts = {(h, i) for h in hosts for i in range(per_host) if not site.flaky(h, i)}

            def done(site: BehaviourSite = site, firsts: set[tuple[str, int]] = firsts) -> bool:
                got = {(h, int(p[3:-5])) for _, h, p in site.pages()}
                return firsts <= got
            wait_until(done, 120, f"every healthy page of the {name} run")
            pages = site.pages()
            took[name] = pages[-1][0] - pages[0][0]
            if every:  # and the flaky pages were retried and stored, not lost
                wait_until(lambda s=s: sum(_stored(s, h) for h in hosts) == len(hosts) * per_host,
                           120, "every page stored")
            fleet.stop(10)
    # Deferring a whole site for each 503 made this 3-5x slower; slowing it costs little.
    assert took["flaky"] <= 2.5 * took["clean"] + 1.0, took


def test_a_slow_site_holds_at_most_its_inflight_limit(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    slow, other = _hosts(2, 2)
    s = settings.replace(rate_cap=50.0)
    port = _port([slow, other])
    with BehaviourSite(port, {slow: Behaviour(delay_s=1.0), other: Behaviour()}) as site:
        fleet_factory(s)
        publish(site.urls(slow, 40) + site.urls(other, 40), s)
        wait_until(lambda: len(site.pages(slow)) >= 40, 120, "every slow page requested")
        others_done = site.pages(other)[-1][0]
        slow_done = site.pages(slow)[-1][0]
    # At 50 req/s and 1 s per answer, an unlimited site would hold ~40 connections.
    assert 2 <= site.max_open[slow] <= s.max_inflight_per_target, site.max_open
    assert others_done < slow_done  # the fast site did not wait for the slow one


def test_a_timing_out_site_gets_less_traffic_and_others_none_the_worse(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    silent, other = _hosts(2, 2)
    s = settings.replace(rate_cap=10.0, request_timeout_s=1.0)
    port = _port([silent, other])
    with BehaviourSite(port, {silent: Behaviour(delay_s=30.0), other: Behaviour()}) as site:
        fleet_factory(s)
        publish(site.urls(silent, 100) + site.urls(other, 100), s)
        wait_until(lambda: len(site.pages(other)) >= 100, 120, "every healthy page")
        pages = site.pages(other)
        window = pages[-1][0] - pages[0][0]
        to_silent = sum(1 for t, _, _ in site.pages(silent) if t <= pages[-1][0])
    # Its cap would allow ~10 req/s, its in-flight limit 8 per second of timeout: after a
    # few timeouts it is down to one connection and then rests between attempts.
    assert to_silent <= 0.25 * 10 * window, (to_silent, window)
    assert 99 / window >= 0.7 * 10, window  # the healthy site kept its cap's pace


def test_a_long_retry_after_rests_its_site_while_others_retry_on_time(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    """``Retry-After: 3600`` on one target; targets in the same partition answer some pages
    with ``503, Retry-After: 20``: both retries go to the same retry tier and partition,
    and theirs must come back after 20 s, not after the hour."""
    candidates = _hosts(2, 40)
    part = partition_for(candidates[0], settings.topic_partitions)
    same = [h for h in candidates if partition_for(h, settings.topic_partitions) == part]
    resting, others = same[0], same[1:3]
    assert len(others) == 2
    port = _port([resting, *others])
    behaviours = {resting: Behaviour(status=429, retry_after="3600"),
                  **{h: Behaviour(flaky_every=4, flaky_retry_after="20") for h in others}}
    s = settings.replace(rate_cap=10.0)
    with BehaviourSite(port, behaviours) as site:
        fleet_factory(s)
        publish(site.urls(resting, 30), s)
        time.sleep(1.0)  # its retry is written first: first in the tier's partition
        publish([u for h in others for u in site.urls(h, 8)], s)
        wait_until(lambda: sum(_stored(s, h) for h in others) == 16, 150,
                   "the other sites' pages, retried ones included")
        retried = [p for _, h, p in site.pages() if h in others]
        gauges = _fetch_gauges(s)
        dead = int(query(s, f"SELECT count() FROM dead_letters FINAL WHERE target = '{resting}'"
                         )[0][0])
    assert len(retried) == 16 + 4  # 2 flaky pages per site, asked once more each
    assert len(site.pages(resting)) == 1  # one 429, then it rests for the hour
    assert dead == 0  # its jobs wait (parked), they are not dropped
    assert gauges.get("parked", 0) >= 29, gauges


def test_a_blocking_site_is_blocked_never_success_and_gets_less_traffic(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    blocking, other = _hosts(2, 2)
    s = settings.replace(rate_cap=10.0)
    port = _port([blocking, other])
    with BehaviourSite(port, {blocking: Behaviour(status=403), other: Behaviour()}) as site:
        fleet_factory(s)
        publish(site.urls(blocking, 60) + site.urls(other, 60), s)
        wait_until(lambda: _stored(s, other) >= 60, 120, "every healthy page stored")
        last = site.pages(other)[-1][0]
        to_blocking = sum(1 for t, _, _ in site.pages(blocking) if t <= last)
        wait_until(lambda: int(query(s, "SELECT count() FROM fetch_events FINAL WHERE "
                                        f"target = '{blocking}'")[0][0]) >= to_blocking,
                   60, "the blocked attempts' telemetry")
        rows = query(s, "SELECT outcome, count() FROM fetch_events FINAL "
                        f"WHERE target = '{blocking}' GROUP BY outcome")
        health = query(s, f"SELECT ok, blocked FROM dash_target_health WHERE target = "
                          f"'{blocking}'")
    outcomes = {str(o): int(n) for o, n in rows}
    assert set(outcomes) == {"blocked"}, outcomes  # never "ok"
    assert health and int(health[0][0]) == 0 and int(health[0][1]) == outcomes["blocked"]
    # Same cap, same number of URLs: the site that says no got a fraction of the traffic.
    assert to_blocking <= 0.5 * 60, to_blocking
