"""Egress health without a cascade, on the real broker: one site's verdict stays that site's.

A site bans one of two real forward proxies (proxy.py, tagged, so the site sees which one
carried each request); one fetch worker crawls it and a second site through both. At the
default ``egress_failures`` and at the tightest (1), the banned proxy keeps carrying its
round-robin share of the other site's requests after the ban (the site's own log is the
referee): a block is counted by the quarantine per (target, egress), never as the egress's
ill health. Before the fix, px2 carried none of the other site's requests after the ban.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fleet_helpers import (
    Proxy,
    Workers,
    create_all_topics,
    publish_seeds,
    query,
    report,
    wait_until,
)

from core.config import Settings
from infra.views import expand, load_views
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

UA = "alphabot/1.0 (+https://example.org/alpha)"



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
        if failures is None:  # the store says which exit each site disliked (point 3)
            ws.start("parse", "parse-0")
            ws.start("store", "store-0")
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
    if failures is None:
        _assert_identity_health(s, ws, bans, other, to_bans, to_other)


def _assert_identity_health(s: Settings, ws: Workers, bans: str, other: str,
                            to_bans: list[tuple[float, str, int]],
                            to_other: list[tuple[float, str, int]]) -> None:
    """fetch_events keeps each attempt's egress, and identity_health shows the ban where
    it is: px2 on the banning site only (the site's own log is the referee)."""
    view = expand(load_views()["identity_health"].sql, 3600)
    ws.wait_store_ready()

    def rows() -> dict[tuple[str, str, str], tuple[int, int]]:
        got = {}
        for r in query(s, view):
            host = str(r[0]).split(":")[0]
            got[(host, str(r[1]), str(r[2]))] = (int(r[3]), int(r[4]))  # requests, blocked
        return got

    want = {(host, "egress", egress): (sum(1 for _, e, _ in seen if e == egress),
                                       sum(1 for _, e, st in seen if e == egress and st == 403))
            for host, seen in ((bans, to_bans), (other, to_other)) for egress in ("px1", "px2")}
    wait_until(lambda: all(rows().get(k, (0, 0))[0] >= v[0] for k, v in want.items()), 60,
               f"every attempt's row in the store: {want}\n{ws.logs()}")
    got = rows()
    assert {k: got[k] for k in want} == want
    assert want[(bans, "egress", "px2")][1] == want[(bans, "egress", "px2")][0] > 0
    assert got[(bans, "profile", "alpha")] == (len(to_bans), want[(bans, "egress", "px2")][1])
