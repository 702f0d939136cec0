"""robots.txt per profile token, on the real broker, refereed by the site's own log.

A site's robots.txt names one profile's token (``alphabot``: a Crawl-delay, ``/private/``
disallowed) and not the other's (``betabot`` falls to ``*``, which disallows ``/staff/``).
One fetch worker crawls pinned jobs of both profiles:

- each profile obeys its own group: alphabot never asks ``/private/`` (its job is a dead
  letter ``robots_disallowed``) but fetches ``/staff/`` (its own group allows it), betabot
  the other way round;
- the target's pace is the strictest of the tokens allowed on it: every request to it,
  betabot's included, came at least alphabot's Crawl-delay after the one before (the
  site's clock); a second host with the same file, on which only betabot is allowed
  (alpha's ``targets`` leave it out), is crawled at its cap, not at alphabot's delay.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable

import pytest
from aiohttp import web
from fleet_helpers import Workers, create_all_topics, publish_seeds, read_topic, report, wait_until

from core.config import Settings
from infra.topics import topology_of
from schemas.codec import default_codec
from sites.demo_server import free_port
from sites.loop_site import LoopSite

pytestmark = pytest.mark.integration

ALPHA_UA = "alphabot/1.0 (+https://example.org/alpha)"
BETA_UA = "betabot/1.0 (+https://example.org/beta)"
DELAY_S = 0.6
ROBOTS = f"""User-agent: alphabot
Crawl-delay: {DELAY_S}
Disallow: /private/

User-agent: *
Disallow: /staff/
"""


class TokenSite(LoopSite):
    """Serves ``ROBOTS`` and a page for any other path on each host, logging every request:
    (monotonic arrival time, host, path, the User-Agent's product token)."""

    def __init__(self, hosts: tuple[str, ...], port: int) -> None:
        super().__init__(hosts, port, "token-site")
        self.log: list[tuple[float, str, str, str]] = []
        self._log_lock = threading.Lock()

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        token = request.headers.get("User-Agent", "").split("/", 1)[0]
        with self._log_lock:
            self.log.append((time.monotonic(), request.host.split(":")[0], request.path,
                             token))
        if request.path == "/robots.txt":
            return web.Response(text=ROBOTS)
        return web.Response(text=f"<html><p>{request.path}</p></html>",
                            content_type="text/html")

    def requests(self, host: str) -> list[tuple[float, str, str]]:
        with self._log_lock:
            return [(at, path, token) for at, h, path, token in self.log if h == host]


def test_each_profile_obeys_its_own_group_and_the_target_goes_at_the_strictest_pace(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    strict, free = "127.0.0.2", "127.0.0.3"
    s = settings.replace(rate_cap=20.0, default_profile="alpha", profiles={
        "alpha": {"user_agent": ALPHA_UA, "region": "local", "targets": [strict]},
        "beta": {"user_agent": BETA_UA, "region": "local"}})
    port = free_port((strict, free), 19350)
    paths = ["/p/0", "/p/1", "/p/2", "/private/a", "/staff/a"]
    jobs = [(strict, prof, path) for prof in ("alpha", "beta") for path in paths]
    jobs += [(free, "beta", f"/q/{i}") for i in range(6)]
    with TokenSite((strict, free), port) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start("fetch", "fetch-0")
        publish_seeds(s, [json.dumps({"url": f"http://{h}:{port}{p}", "profile": prof})
                          for h, prof, p in jobs])
        topo = topology_of(s)

        def pages(host: str) -> list[tuple[float, str, str]]:
            return [r for r in site.requests(host) if r[1] != "/robots.txt"]

        wait_until(lambda: len(pages(strict)) >= 8 and len(pages(free)) >= 6, 90,
                   f"both hosts crawled\n{ws.logs()}")
        dead = wait_until(lambda: len(d := read_topic(s, topo.dead, 5.0)) >= 2 and d, 30,
                          "the disallowed jobs' dead letters")
        time.sleep(1.0)  # a request that should not come would be logged by now
        to_strict, to_free = site.requests(strict), site.requests(free)

    asked = sorted((token, path) for _, path, token in to_strict if path != "/robots.txt")
    assert asked == sorted([("alphabot", p) for p in ("/p/0", "/p/1", "/p/2", "/staff/a")]
                           + [("betabot", p) for p in ("/p/0", "/p/1", "/p/2",
                                                       "/private/a")]), asked
    codec = default_codec()
    letters = sorted((d["job"]["profile"], d["job"]["url"], d["reason"]) for d in
                     (codec.decode("DeadLetter", r.value, r.headers) for r in dead))
    assert letters == [("alpha", f"http://{strict}:{port}/private/a", "robots_disallowed"),
                       ("beta", f"http://{strict}:{port}/staff/a", "robots_disallowed")]
    # The strict host: every request (robots.txt's included, and betabot's, whose own
    # group sets no delay) at least alphabot's Crawl-delay after the one before.
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(to_strict)]
    # The free host: only betabot is allowed there, so alphabot's delay is not its pace.
    free_gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(to_free))
    report("robots_tokens", strict_min_gap=f"{min(gaps):.3f}",
           free_median_gap=f"{free_gaps[len(free_gaps) // 2]:.3f}")
    assert min(gaps) >= DELAY_S * 0.95, gaps
    assert {token for _, _, token in to_free} == {"betabot"}
    assert free_gaps[len(free_gaps) // 2] < min(gaps), (free_gaps, gaps)
