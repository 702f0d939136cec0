"""Identities on the wire: cookie jars per (target, profile), egress per attempt through real
forward proxies, and the address check kept through a proxy.

- (a) on the real broker, a fleet crawls a local site that sets a session cookie: each
  profile (told apart by its own User-Agent) only ever returns the cookie set for it, a
  second profile on the same target starts with none, robots.txt is asked without cookies,
  and the worker that takes the partition over after a rebalance starts clean;
- (b), (c), (d) the fetcher with two real forward proxies (proxy.py, each in a subprocess on
  loopback, counted from its access log: the site closes every connection, so each request
  is one proxy connection and one log line): attempts spread over the pool, a retry after a
  block goes through the other proxy, every proxied request reached the checked address;
  a name that rebinds to a refused address never gets a request through either proxy;
  https goes through each proxy as a CONNECT to the checked address, the name kept as Host
  and TLS server name, the certificate verified (a test CA given as ``tls_ca_file``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web
from fleet_helpers import Proxy, Workers, create_all_topics, publish_seeds, wait_until

from consumers.fetch.classify import Signal
from consumers.fetch.http import Fetcher, Identity
from consumers.fetch.identities import Identities
from consumers.fetch.resolver import StaticResolver
from core.config import Settings
from core.errors import CrawlfleetError, ForbiddenAddressError
from sites.loop_site import LoopSite

pytestmark = pytest.mark.integration

ALPHA_UA = "alphabot/1.0 (+https://example.org/alpha)"
BETA_UA = "betabot/1.0 (+https://example.org/beta)"
CHECKED, REFUSED = "127.0.0.3", "127.0.0.2"


class SessionSite(LoopSite):
    """A loopback site that sets ``sid`` (a fresh value each time) on any page request
    arriving without one, answers 429 to the first request of ``/limited``, and logs every
    request: path, User-Agent, Cookie, Host header and the local address it arrived on."""

    def __init__(self, hosts: tuple[str, ...], port: int,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(hosts, port, "session-site", ssl_context)
        self.log: list[dict[str, Any]] = []
        self.sids = 0

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        with self._lock:
            n = sum(1 for r in self.log if r["path"] == request.path)
            self.log.append({"path": request.path, "ua": request.headers.get("User-Agent"),
                             "cookie": request.headers.get("Cookie"), "host": request.host,
                             "at": sock[0] if sock else None})
            self.sids += 1
            sid = f"s{self.sids}"
        if request.path == "/robots.txt":
            resp = web.Response(text="User-agent: *\nAllow: /\n")
        elif request.path == "/limited" and n == 0:
            resp = web.Response(status=429, text="slow down")
        else:
            resp = web.Response(text="<html><body>page</body></html>", content_type="text/html")
            if "sid=" not in (request.headers.get("Cookie") or ""):
                resp.set_cookie("sid", sid)
        resp.force_close()  # one request per connection: each proxy logs each request
        return resp

    def requests(self, path_prefix: str = "/") -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.log if r["path"].startswith(path_prefix)]


# --- (a) cookie jars on a fleet -------------------------------------------------------------


def _sid(cookie: str | None) -> str | None:
    m = re.search(r"sid=(\w+)", cookie or "")
    return m.group(1) if m else None


def _pages(site: SessionSite, ua: str, prefix: str) -> list[dict[str, Any]]:
    return [r for r in site.requests(prefix) if r["ua"] == ua]


def test_cookies_stay_with_their_target_and_profile_and_a_new_owner_starts_clean(
        settings: Settings, fleet: Any, site_port: int) -> None:
    # A short session: the stopped worker is a static member (no LeaveGroup on close), so
    # its partitions reach fetch-1 only once its session expires (the default 30 s).
    s = dataclasses.replace(settings, rate_cap=5.0, session_timeout_ms=6000, profiles={
        "alpha": {"user_agent": ALPHA_UA, "region": "local", "cookies": True},
        "beta": {"user_agent": BETA_UA, "region": "local", "cookies": True}},
        default_profile="alpha")
    base = f"http://127.0.0.4:{site_port}"
    n = 6
    with SessionSite(("127.0.0.4",), site_port) as site:
        create_all_topics(s)
        workers: Workers = fleet(s)
        workers.start_pipeline(fetch=1)
        publish_seeds(s, [json.dumps({"url": f"{base}/a/{i}", "profile": "alpha"})
                          for i in range(n)]
                      + [json.dumps({"url": f"{base}/b/{i}", "profile": "beta"})
                         for i in range(n)])
        wait_until(lambda: len(_pages(site, ALPHA_UA, "/a/")) >= n
                   and len(_pages(site, BETA_UA, "/b/")) >= n, 90, "both profiles' pages")
        alpha, beta = _pages(site, ALPHA_UA, "/a/"), _pages(site, BETA_UA, "/b/")
        # Each profile's first request carries no cookie; later ones return the sid the
        # site set for that profile, never the other's.
        assert alpha[0]["cookie"] is None and beta[0]["cookie"] is None
        alpha_sids = {_sid(r["cookie"]) for r in alpha[1:]}
        beta_sids = {_sid(r["cookie"]) for r in beta[1:]}
        assert len(alpha_sids) == 1 and len(beta_sids) == 1, (alpha, beta)
        assert None not in alpha_sids and alpha_sids.isdisjoint(beta_sids)
        robots = site.requests("/robots.txt")
        assert robots and all(r["cookie"] is None for r in robots)
        assert {r["ua"] for r in robots} <= {ALPHA_UA, BETA_UA}

        # A rebalance: a second fetch worker joins, the first leaves; the new owner of the
        # target's partition has never held its jars.
        workers.start("fetch", "fetch-1")
        workers.all["fetch-0"].stop()
        wait_until(lambda: len(workers.all["fetch-1"].assignment()) > 0, 60,
                   "fetch-1 to own the frontier partitions")
        publish_seeds(s, [json.dumps({"url": f"{base}/c/{i}", "profile": "alpha"})
                          for i in range(3)])
        wait_until(lambda: len(_pages(site, ALPHA_UA, "/c/")) >= 3, 90, "the new owner's pages")
        after = _pages(site, ALPHA_UA, "/c/")
        assert after[0]["cookie"] is None  # starts clean
        later = {_sid(r["cookie"]) for r in after[1:]}
        assert len(later) == 1 and later.isdisjoint(alpha_sids) and None not in later


# --- (b), (c) egress through real proxies -----------------------------------------------------


@pytest.fixture
def proxies(tmp_path: Path) -> Iterator[tuple[Proxy, Proxy]]:
    pair = (Proxy(tmp_path / "p1.log"), Proxy(tmp_path / "p2.log"))
    try:
        for p in pair:
            p.wait_ready()
        yield pair
    finally:
        for p in pair:
            p.stop()


def _proxied_settings(tmp_path: Path, p1: Proxy, p2: Proxy) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", allow_private=False, allow_hosts=(CHECKED,),
        request_timeout_s=5.0,
        egress={"p1": {"proxy": f"http://crawler:hunter2@127.0.0.1:{p1.port}",
                       "region": "local"},
                "p2": {"proxy": f"http://127.0.0.1:{p2.port}", "region": "local"}},
        profiles={"alpha": {"user_agent": ALPHA_UA, "region": "local",
                            "egress": ["p1", "p2"], "cookies": True}},
        default_profile="alpha")


def _identity(s: Settings, ids: Identities, target: str, egress: str) -> Identity:
    proxy = s.egress_table[egress].proxy
    return Identity(s.profile_table["alpha"].request_headers(), ids.jar(target, "alpha"),
                    proxy or None)


def test_attempts_spread_over_the_pool_a_retry_after_a_block_switches_and_the_checked_address_is_what_the_proxy_reaches(  # noqa: E501
        tmp_path: Path, proxies: tuple[Proxy, Proxy], site_port: int) -> None:
    p1, p2 = proxies
    s = _proxied_settings(tmp_path, p1, p2)
    by_name = {"p1": p1, "p2": p2}
    target = f"site.test:{site_port}"
    resolver = StaticResolver({"site.test": [[CHECKED]]})

    async def body() -> list[str]:
        ids = Identities.of(s)
        used = []
        async with Fetcher(s, resolver=resolver) as f:
            for i in range(6):
                egress = ids.choose_egress(target, "alpha", None, None, time.monotonic(), 0)
                assert egress is not None
                used.append(egress)
                resp = await f.get(f"http://{target}/page/{i}",
                                   identity=_identity(s, ids, target, egress))
                assert resp.status == 200
            first = ids.choose_egress(target, "alpha", None, None, time.monotonic(), 0)
            assert first is not None
            resp = await f.get(f"http://{target}/limited",
                               identity=_identity(s, ids, target, first))
            assert resp.status == 429
            ids.observe(target, "alpha", first, Signal.THROTTLED, time.monotonic())
            again = ids.choose_egress(target, "alpha", first, "http_429", time.monotonic(), 0)
            assert again is not None
            resp = await f.get(f"http://{target}/limited",
                               identity=_identity(s, ids, target, again))
            assert resp.status == 200
            used += [first, again]
        return used

    with SessionSite((CHECKED, REFUSED), site_port) as site:
        used = asyncio.run(body())
        wait_until(lambda: len(p1.carried()) + len(p2.carried()) >= 8, 10, "proxy logs")
        carried = {name: p.carried() for name, p in by_name.items()}
        pages = site.requests("/page/")
        limited = site.requests("/limited")

    # Spread: the six pages went three and three, each proxy carrying what was sent to it.
    assert sorted(used[:6]) == ["p1"] * 3 + ["p2"] * 3
    for name in by_name:
        assert sum(1 for c in carried[name] if "/page/" in c) == used[:6].count(name)
    # The retry after the 429 went through the other proxy.
    first, again = used[6], used[7]
    assert first != again
    assert [c for c in carried[first] if c.endswith("/limited")] == \
        [f"{CHECKED}:{site_port}/limited"]
    assert [c for c in carried[again] if c.endswith("/limited")] == \
        [f"{CHECKED}:{site_port}/limited"]
    # Every request reached the checked address, named site.test, as its profile.
    every = [c for cs in carried.values() for c in cs]
    assert every and all(c.startswith(f"{CHECKED}:{site_port}/") for c in every)
    assert len(pages) == 6 and len(limited) == 2
    for r in [*pages, *limited]:
        assert r["at"] == CHECKED and r["host"] == target and r["ua"] == ALPHA_UA
    # The site's cookie came back through either proxy: one (target, profile) jar.
    assert pages[0]["cookie"] is None
    assert len({_sid(r["cookie"]) for r in pages[1:]}) == 1


def test_a_rebinding_name_never_reaches_the_refused_address_through_a_proxy(
        tmp_path: Path, proxies: tuple[Proxy, Proxy], site_port: int) -> None:
    p1, p2 = proxies
    s = _proxied_settings(tmp_path, p1, p2)
    target = f"rebind.test:{site_port}"
    # Allowed first (what a check would see), refused on every later answer.
    resolver = StaticResolver({"rebind.test": [[CHECKED], [REFUSED]]})

    async def body() -> CrawlfleetError:
        ids = Identities.of(s)
        async with Fetcher(s, resolver=resolver) as f:
            egress = ids.choose_egress(target, "alpha", None, None, time.monotonic(), 0)
            assert egress is not None
            first = await f.get(f"http://{target}/one", identity=_identity(s, ids, target, egress))
            assert first.status == 200
            for egress in ("p1", "p2"):
                try:
                    await f.get(f"http://{target}/two", identity=_identity(s, ids, target, egress))
                except CrawlfleetError as exc:
                    err = exc
                else:
                    raise AssertionError("a rebinding answer reached the site")
        return err

    with SessionSite((CHECKED, REFUSED), site_port) as site:
        err = asyncio.run(body())
        wait_until(lambda: len(p1.carried()) + len(p2.carried()) >= 1, 10, "proxy logs")
        time.sleep(0.5)  # a stray request would be logged by now
        carried = p1.carried() + p2.carried()
        seen = site.requests("/")

    assert isinstance(err, ForbiddenAddressError)
    assert err.reason == "address_not_allowed" and not err.retryable  # a dead letter at once
    assert carried == [f"{CHECKED}:{site_port}/one"]  # 0 requests for the refused address
    assert [r["at"] for r in seen] == [CHECKED]


def test_a_proxy_password_never_reaches_an_error_message(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]  # nothing listens here once closed
    s = Settings(data_dir=tmp_path / "data", allow_private=True, request_timeout_s=3.0,
                 egress={"gone": {"proxy": f"http://crawler:hunter2@127.0.0.1:{dead}",
                                  "region": "local"}},
                 profiles={"alpha": {"user_agent": ALPHA_UA, "region": "local",
                                     "egress": ["gone"]}}, default_profile="alpha")

    async def body() -> CrawlfleetError:
        async with Fetcher(s) as f:
            try:
                await f.get("http://127.0.0.1:9/", identity=Identity(
                    {"User-Agent": ALPHA_UA}, None, s.egress_table["gone"].proxy))
            except CrawlfleetError as exc:
                return exc
        raise AssertionError("a dead proxy answered")

    err = asyncio.run(body())
    assert err.reason == "connect" and err.retryable
    assert "hunter2" not in str(err) and "hunter2" not in repr(err.args)


def test_https_through_a_proxy_is_a_connect_to_the_checked_address_with_the_name_kept(
        tmp_path: Path, proxies: tuple[Proxy, Proxy], site_port: int) -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("tls.test").configure_cert(server_ctx)
    names: list[str | None] = []
    server_ctx.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore[assignment,misc]
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    p1, p2 = proxies
    trusting = dataclasses.replace(_proxied_settings(tmp_path, p1, p2), tls_ca_file=str(ca_file))
    plain = _proxied_settings(tmp_path, p1, p2)  # the system's trust store only
    target = f"tls.test:{site_port}"
    resolver = StaticResolver({"tls.test": [[CHECKED]]})

    async def body() -> tuple[list[int], CrawlfleetError | None]:
        ids = Identities.of(trusting)
        statuses = []
        async with Fetcher(trusting, resolver=resolver) as f:
            for egress in ("p1", "p2"):
                resp = await f.get(f"https://{target}/page/{egress}",
                                   identity=_identity(trusting, ids, target, egress))
                statuses.append(resp.status)
        refused = None
        async with Fetcher(plain, resolver=resolver) as f:
            try:
                await f.get(f"https://{target}/unverified",
                            identity=_identity(plain, ids, target, "p1"))
            except CrawlfleetError as exc:
                refused = exc
        return statuses, refused

    with SessionSite((CHECKED, REFUSED), site_port, ssl_context=server_ctx) as site:
        statuses, refused = asyncio.run(body())
        wait_until(lambda: len(p1.carried()) >= 2 and len(p2.carried()) >= 1, 10, "proxy logs")
        carried = {"p1": p1.carried(), "p2": p2.carried()}
        pages = site.requests("/")

    assert statuses == [200, 200]
    # Each proxy was asked to CONNECT to the checked address, never to resolve the name.
    assert carried["p2"] == [f"{CHECKED}:{site_port}"]
    assert carried["p1"] == [f"{CHECKED}:{site_port}"] * 2  # the page, the refused attempt
    # Through the tunnel, the site saw the name: as TLS server name and as Host.
    assert names[:2] == ["tls.test", "tls.test"]
    assert [r["path"] for r in pages] == ["/page/p1", "/page/p2"]
    assert all(r["host"] == target and r["at"] == CHECKED for r in pages)
    # Without the CA the certificate does not verify: no page is fetched unverified.
    assert refused is not None and "unverified" not in [r["path"] for r in pages]
