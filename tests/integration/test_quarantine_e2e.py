"""Quarantine end to end: a whole fleet (fetch, parse, store, retry and the quarantine app)
on the real broker and chDB, crawling local sites that push back.

- A site that bans one profile (by its User-Agent) is quarantined for that (target, profile)
  pair only, at the configured count of blocks; the target's other profiles carry on, other
  targets are untouched, and the target is never asked faster than its cap afterwards, when
  the banned profile's work is placed on the others.
- A site that says no to everything after its first answer: the target is paused by a
  target quarantine, and at most one identity of it is retired second-order.
- A site that bans one egress (one of two real forward proxies): that egress is quarantined
  for that target only; the other proxy carries the target's work on, and the banned egress
  still carries another target's.

Everything is refereed at the site (who asked, through which proxy, when) and in the store
(pages, fetch events, the quarantines table), never by a worker's own counters.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from fleet_helpers import Proxy, query, store_ready, wait_until
from fleet_helpers import report as fault_report

from core.config import Settings
from crawlfleet.crawl import Fleet
from producers.frontier import publish
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

CAP = 5.0
BLOCKS = 2  # the configured N: "2 blocks within 10 min" (the default is 3)
#: README's promise: fetch workers apply a quarantine within 5 s of the block that triggered
#: it; what the identity sent meanwhile (in flight, or before the record reached the worker:
#: at most the target's cap for those seconds) may still be refused. Seen here: 1.3 s.
APPLY_S = 5.0


def _ua(name: str) -> str:
    return f"{name}bot/1.0 (+https://example.org/{name})"


def _settings(settings: Settings, egress: dict[str, Any] | None = None,
              pool: tuple[str, ...] = ("direct",),
              names: tuple[str, ...] = ("alpha", "beta", "gamma")) -> Settings:
    return settings.replace(
        rate_cap=CAP, quarantine_blocks=BLOCKS, quarantine_window_s=600.0,
        quarantine_s=600.0, egress=egress or {}, default_profile=names[0],
        profiles={n: {"user_agent": _ua(n), "region": "local", "egress": list(pool)}
                  for n in names})


def _stored(s: Settings, host: str) -> int:
    if not store_ready(s):
        return 0
    return int(query(s, f"SELECT count() FROM pages FINAL WHERE target = '{host}'")[0][0])


def _quarantines(s: Settings, host: str) -> list[tuple[str, str, int, str, float, int]]:
    """(scope, name, second_order, reason, at as Unix s, blocks counted) of every quarantine
    of ``host``."""
    if not store_ready(s):
        return []
    rows = query(s, "SELECT scope, name, second_order, reason, toFloat64(at), blocks FROM "
                    f"quarantines FINAL WHERE target = '{host}' ORDER BY at")
    return [(str(a), str(b), int(c), str(d), float(e), int(f)) for a, b, c, d, e, f in rows]


def _wall(site_t: float) -> float:
    """A site log time (monotonic) as Unix time."""
    return site_t + (time.time() - time.monotonic())


def test_a_banned_profile_is_quarantined_for_its_target_alone_and_the_target_never_speeds_up(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    bans, fine, walls = "127.0.0.2", "127.0.0.3", "127.0.0.4"
    s = _settings(settings)
    port = free_port((bans, fine, walls), 18900)
    hosts = {bans: Behaviour(block_agents=("betabot",)), fine: Behaviour(),
             walls: Behaviour(block_after=1)}
    with BehaviourSite(port, hosts) as site:
        fleet_factory(s)
        report = publish(site.urls(bans, 30) + site.urls(fine, 30) + site.urls(walls, 30), s)
        assert not report.errors
        wait_until(lambda: _stored(s, bans) >= 30 and _stored(s, fine) >= 30, 240,
                   "the banning and the fine site crawled to the end")
        wait_until(lambda: any(q[0] == "target" for q in _quarantines(s, walls)), 180,
                   "the walled site paused by a target quarantine")
        seen = list(site.seen)
        q_bans = _quarantines(s, bans)
        q_walls = _quarantines(s, walls)
        q_fine = _quarantines(s, fine)
        beta_events = query(s, "SELECT outcome, reason, count() FROM fetch_events FINAL WHERE "
                               f"target = '{bans}' AND profile = 'beta' GROUP BY outcome, "
                               "reason")
        other_events = query(s, "SELECT profile, outcome, count() FROM fetch_events FINAL "
                                f"WHERE target = '{bans}' AND profile != 'beta' "
                                "GROUP BY profile, outcome")

    # The banning site: (bans, beta) quarantined once, nothing else of it, nothing of the
    # fine site.
    assert [(q[0], q[1]) for q in q_bans] == [("profile", "beta")], q_bans
    assert q_fine == []
    assert q_bans[0][2] == 0 and "block" in q_bans[0][3]  # a first-order retirement, a reason
    # It triggered at exactly N blocks (the app's count), and the worker applied it within
    # APPLY_S: beta asked nothing after that, and no more than N plus what it could send
    # meanwhile at the target's cap (requests in flight when the block came back included).
    assert q_bans[0][5] == BLOCKS, q_bans
    q_at = q_bans[0][4] + 0.001  # stored in whole milliseconds: the block's own, truncated
    beta = [r for r in seen if r.host == bans and r.agent == "betabot" and r.path != "/robots.txt"]
    assert all(r.status == 403 for r in beta)
    assert sum(1 for r in beta if _wall(r.at) <= q_at) >= BLOCKS, beta
    assert not [r for r in beta if _wall(r.at) > q_at + APPLY_S], [(_wall(r.at), q_at)
                                                                    for r in beta]
    assert len(beta) <= BLOCKS + math.ceil(CAP * APPLY_S), len(beta)
    fault_report("quarantine_apply", beta_requests=len(beta), blocks=BLOCKS,
           after_trigger=sum(1 for r in beta if _wall(r.at) > q_at),
           last_after_trigger_s=round(max(_wall(r.at) for r in beta) - q_at, 3))
    # Telemetry carries the reason of every refused request; the others went on, never blocked.
    assert {(str(o), str(r)) for o, r, _ in beta_events} == {("blocked", "http_403")}, beta_events
    # (gamma may never be asked at all: once the target has refused beta, only identities it
    # has already seen are placed there, never a fresh one.)
    others = {(str(p), str(o)): int(n) for p, o, n in other_events}
    assert {p for p, _ in others} <= {"alpha", "gamma"} and {o for _, o in others} == {"ok"}
    # Every URL of the banning site was stored: beta's refusals as 403 pages, the rest fetched
    # by alpha and gamma, including the work placed on them after the quarantine.
    # (Beta's own requests in the APPLY_S after the trigger are bounded above; the line
    # here used to allow it none: the worker applied it 1.3 s after the trigger once.)
    after = [r for r in seen if r.host == bans and r.path != "/robots.txt"
             and _wall(r.at) > q_at]
    assert {r.agent for r in after} & {"alphabot", "gammabot"}, after
    assert {r.agent for r in after if _wall(r.at) > q_at + APPLY_S} <= {"alphabot", "gammabot"}
    # The target's aggregate rate did not rise: after the quarantine, no two requests to it
    # came closer together than its cap allows (the re-placed work went through the same
    # per-target limiter).
    arrivals = sorted(r.at for r in after)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) >= 0.8 / CAP, sorted(gaps)[:5]
    # The walled site: its first answer was a page, then only 403s; the target was paused
    # instead of burning every profile, and at most one identity went second-order.
    walled = [r for r in seen if r.host == walls and r.path != "/robots.txt"]
    assert walled[0].status == 200 and {r.status for r in walled[1:]} == {403}
    assert sum(q[2] for q in q_walls) <= 1, q_walls
    profiles_out = [q for q in q_walls if q[0] == "profile"]
    assert len(profiles_out) < 3, q_walls  # the target pause came before the last profile
    paused_at = next(q[4] for q in q_walls if q[0] == "target")
    assert not [r for r in walled if _wall(r.at) > paused_at + APPLY_S]  # paused: no asking



def test_a_banned_egress_is_quarantined_for_its_target_only(
        settings: Settings, fleet_factory: Callable[..., Fleet],
        tagged_proxies: tuple[Proxy, Proxy]) -> None:
    px1, px2 = tagged_proxies
    bans, slow = "127.0.0.5", "127.0.0.6"
    s = _settings(settings, egress={"px1": {"proxy": f"http://127.0.0.1:{px1.port}",
                                            "region": "local"},
                                    "px2": {"proxy": f"http://127.0.0.1:{px2.port}",
                                            "region": "local"}},
                  pool=("px1", "px2"), names=("alpha", "beta", "gamma", "delta"))
    s = s.replace(rate_caps={slow: 1.0})  # its crawl outlasts the other site's quarantine
    port = free_port((bans, slow), 18950)
    with BehaviourSite(port, {bans: Behaviour(block_egress=("px2",)), slow: Behaviour()}) as site:
        fleet_factory(s)
        assert not publish(site.urls(bans, 24) + site.urls(slow, 24), s).errors
        wait_until(lambda: _stored(s, bans) >= 24 and _stored(s, slow) >= 24, 240,
                   "both sites crawled to the end")
        seen = list(site.seen)
        q_bans, q_slow = _quarantines(s, bans), _quarantines(s, slow)

    # Only the banned egress is retired, for the banning target only.
    assert [(q[0], q[1]) for q in q_bans] == [("egress", "px2")], q_bans
    assert q_slow == []
    q_at = q_bans[0][4]
    to_bans = [r for r in seen if r.host == bans and r.path != "/robots.txt"]
    assert {r.egress for r in to_bans} == {"px1", "px2"}  # every request went by a proxy
    assert not [r for r in to_bans if r.egress == "px2" and _wall(r.at) > q_at + APPLY_S]
    assert [r for r in to_bans if r.egress == "px1" and _wall(r.at) > q_at + APPLY_S]
    # The other target still goes through px2 after the quarantine: it is not px2's problem.
    assert [r for r in seen
            if r.host == slow and r.egress == "px2" and _wall(r.at) > q_at + APPLY_S]
