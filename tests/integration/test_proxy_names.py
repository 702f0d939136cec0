"""The address policy holds for proxies named by host: the proxy's name is trusted for the
connection to the proxy only, never for a crawl URL that names it.

- On the real broker, with ``allow_private`` off, a fetch worker whose proxy is named
  ``localhost`` crawls an allowed site through it, while crawl URLs on the proxy's own host
  (the proxy's own port, another port of that name) are dead-lettered
  ``address_not_allowed`` before any request, directly and through the proxy;
- with the fetcher alone, a proxy named ``proxy.test`` that a resolver maps to loopback
  carries an allowed site's page, and ``http://proxy.test:PORT/`` is refused both ways.

Before the fix the proxy's name was trusted for every resolution: both URLs went through.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fleet_helpers import (
    CountingServer,
    Proxy,
    Record,
    Workers,
    create_all_topics,
    publish_seeds,
    read_topic,
    wait_until,
)

from consumers.fetch.http import Fetcher, Identity
from consumers.fetch.resolver import StaticResolver
from core.config import Settings
from core.errors import CrawlfleetError, ForbiddenAddressError
from infra.topics import topology_of
from schemas.codec import default_codec
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

UA = "alphabot/1.0 (+https://example.org/alpha)"
SITE = "127.0.0.4"


def _dead_letters(s: Settings) -> list[Record]:
    return read_topic(s, topology_of(s).dead, timeout=5.0)


def test_a_proxy_named_by_host_is_trusted_for_its_own_connection_only(
        settings: Settings, fleet: Callable[[Settings], Workers], tmp_path: Path) -> None:
    proxy = Proxy(tmp_path / "named.log")
    site_host = SITE
    port = free_port((site_host,), 19250)
    try:
        proxy.wait_ready()
        named = f"http://localhost:{proxy.port}"
        s = settings.replace(
            allow_private=False, allow_hosts=(site_host,),
            egress={"named": {"proxy": named, "region": "local"}},
            profiles={"direct": {"user_agent": UA, "region": "local", "egress": ["direct"]},
                      "proxied": {"user_agent": UA, "region": "local", "egress": ["named"]}},
            default_profile="direct")
        with BehaviourSite(port, {site_host: Behaviour()}) as site:
            create_all_topics(s)
            ws = fleet(s)
            ws.start("fetch", "fetch-0")
            fine = site.url(site_host, 1)
            inside = [f"{named}/", f"http://localhost:{port}/p/1.html"]
            lines = [{"url": fine, "profile": "proxied"}]
            lines += [{"url": u, "profile": p} for u in inside for p in ("direct", "proxied")]
            publish_seeds(s, [json.dumps(line) for line in lines])
            dead = wait_until(lambda: len(_dead_letters(s)) >= 4 and _dead_letters(s), 60,
                              f"the refused URLs' dead letters\n{ws.logs()}")
            wait_until(lambda: site.pages(site_host), 30, "the allowed site's page")
            seen = list(site.seen)
            carried = wait_until(proxy.carried, 10, "the proxy's log")
    finally:
        proxy.stop()

    codec = default_codec()
    letters = [codec.decode("DeadLetter", r.value, r.headers) for r in dead]
    got = sorted((d["job"]["url"], d["job"]["profile"], d["reason"]) for d in letters)
    assert got == sorted((u, p, "address_not_allowed") for u in inside
                         for p in ("direct", "proxied")), got
    assert all("allow_hosts" in d["error"] for d in letters)  # the fix is named
    # The allowed site was crawled through the proxy named by host ...
    assert [(r.path, r.status) for r in seen if r.path != "/robots.txt"] == [("/p/1.html", 200)]
    # ... and the proxy carried requests for the site's address only, nothing for its own
    # host name's (no request reached 127.0.0.1 through it either).
    assert carried and all(c.startswith(f"{site_host}:{port}/") for c in carried), carried


def test_a_proxy_name_mapped_to_loopback_is_refused_as_a_crawl_url_both_ways(
        tmp_path: Path) -> None:
    proxy = Proxy(tmp_path / "mapped.log")
    port = free_port((SITE,), 19300)
    try:
        proxy.wait_ready()
        named = f"http://proxy.test:{proxy.port}"
        s = Settings(data_dir=tmp_path / "data", allow_private=False, allow_hosts=(SITE,),
                     request_timeout_s=5.0)
        resolver = StaticResolver({"proxy.test": [["127.0.0.1"]], "site.test": [[SITE]]})

        async def body() -> tuple[int, list[CrawlfleetError]]:
            refused: list[CrawlfleetError] = []
            async with Fetcher(s, resolver=resolver) as f:
                ok = await f.get(f"http://site.test:{port}/p/1.html",
                                 identity=Identity({"User-Agent": UA}, None, named))
                for via in (None, named):
                    try:
                        await f.get(f"{named}/", identity=Identity({"User-Agent": UA}, None, via))
                    except CrawlfleetError as exc:
                        refused.append(exc)
            return ok.status, refused

        with CountingServer(SITE, port, {"/p/1.html": (200, b"<p>one</p>")}) as site:
            status, refused = asyncio.run(body())
            seen = dict(site.requests)
        carried = wait_until(proxy.carried, 10, "the proxy's log")
    finally:
        proxy.stop()
    assert status == 200 and seen == {"/p/1.html": 1}
    assert len(refused) == 2, refused  # direct, and through the proxy
    assert all(isinstance(e, ForbiddenAddressError) and e.reason == "address_not_allowed"
               for e in refused)
    assert carried == [f"{SITE}:{port}/p/1.html"]  # nothing for the proxy's own address
