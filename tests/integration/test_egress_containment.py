"""Egress health without a cascade, on the real broker: one site's verdict stays that site's.

A site bans one of two real forward proxies (proxy.py, tagged, so the site sees which one
carried each request); one fetch worker crawls it and a second site through both. At the
default ``egress_failures`` and at the tightest (1), the banned proxy keeps carrying its
round-robin share of the other site's requests after the ban (the site's own log is the
referee): a block is counted by the quarantine per (target, egress), never as the egress's
ill health. Before the fix, px2 carried none of the other site's requests after the ban.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_helpers import (
    Proxy,
    Workers,
    create_all_topics,
    publish_seeds,
    report,
    wait_until,
)

from core.config import Settings
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

UA = "alphabot/1.0 (+https://example.org/alpha)"


@pytest.fixture
def tagged_proxies(tmp_path: Path) -> Iterator[tuple[Proxy, Proxy]]:
    pair = (Proxy(tmp_path / "px1.log", tag="px1"), Proxy(tmp_path / "px2.log", tag="px2"))
    try:
        for p in pair:
            p.wait_ready()
        yield pair
    finally:
        for p in pair:
            p.stop()


@pytest.mark.parametrize("failures", [None, 1], ids=["defaults", "egress_failures=1"])
def test_one_site_banning_an_egress_leaves_it_crawling_every_other_site(
        settings: Settings, fleet: Callable[[Settings], Workers],
        tagged_proxies: tuple[Proxy, Proxy], failures: int | None) -> None:
    px1, px2 = tagged_proxies
    bans, other = "127.0.0.2", "127.0.0.3"
    s = settings.replace(
        egress={"px1": {"proxy": f"http://127.0.0.1:{px1.port}", "region": "local"},
                "px2": {"proxy": f"http://127.0.0.1:{px2.port}", "region": "local"}},
        profiles={"alpha": {"user_agent": UA, "region": "local", "egress": ["px1", "px2"]}},
        default_profile="alpha", rate_caps={other: 3.0})
    if failures is not None:
        s = s.replace(egress_failures=failures)
    n_bans, n_other = 16, 24
    port = free_port((bans, other), 19150)
    with BehaviourSite(port, {bans: Behaviour(block_egress=("px2",)),
                              other: Behaviour()}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start("fetch", "fetch-0")
        publish_seeds(s, site.urls(bans, n_bans) + site.urls(other, n_other))

        def pages(host: str) -> list[tuple[float, str, int]]:
            return [(r.at, r.egress, r.status) for r in list(site.seen)
                    if r.host == host and r.path != "/robots.txt"]

        wait_until(lambda: len(pages(bans)) >= n_bans and len(pages(other)) >= n_other, 90,
                   f"both sites crawled\n{ws.logs()}")
        to_bans, to_other = pages(bans), pages(other)

    # The ban happened as the site means it: every request px2 carried there was refused,
    # as many times as the setting would have needed to cool px2 off for good measure.
    banned = [at for at, egress, status in to_bans if egress == "px2"]
    assert {status for _, egress, status in to_bans if egress == "px2"} == {403}
    needed = s.egress_failures
    assert len(banned) >= needed, to_bans
    # After the ban had reached that count, the other site still got px2's share of its
    # requests (round-robin over the pool: about half), all answered.
    after = [egress for at, egress, _ in to_other if at > banned[needed - 1]]
    report("egress_containment", egress_failures=needed, px2_blocks_at_ban=len(banned),
           other_after=len(after), other_after_px2=after.count("px2"))
    assert len(after) >= 6, (banned, to_other)
    assert after.count("px2") >= len(after) / 3, after
    assert {status for _, _, status in to_other} == {200}
