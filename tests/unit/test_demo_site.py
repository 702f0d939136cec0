"""The demo site serves what its spec says, and ``expected()`` is what a correct crawl stores.

The crawler's own tests compare against ``expected()``, so it is checked here against an
independent reference crawl of the running server, not just against itself.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from urllib.parse import urljoin

import aiohttp
import pytest
from protego import Protego
from selectolax.lexbor import LexborHTMLParser

from sites.bench_site import bench_spec
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite, free_port, with_crawl_delay
from sites.shapes import ShapeSite, shape_spec
from sites.site_spec import USER_AGENT, Page, SiteSpec, canonical_url

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture
def port() -> int:
    return free_port(HOSTS, start=18180)


@pytest.fixture
def site(port: int) -> Iterator[DemoSite]:
    with DemoSite(demo_spec(port, HOSTS)) as running:
        yield running


async def _get(url: str) -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, dict(resp.headers), await resp.text()


def get(url: str) -> tuple[int, dict[str, str], str]:
    return asyncio.run(_get(url))


async def _reference_crawl(seeds: list[str], hosts: set[str], retry_503: bool) -> dict[str, int]:
    """A minimal, independent polite crawler: BFS, protego robots, canonical dedupe."""
    robots: dict[str, Protego | None] = {}
    result: dict[str, int] = {}
    seen = {canonical_url(s) for s in seeds}
    queue = list(seen)
    async with aiohttp.ClientSession() as session:
        while queue:
            url = queue.pop(0)
            netloc = url.split("/")[2]
            if netloc not in robots:
                async with session.get(f"http://{netloc}/robots.txt") as r:
                    robots[netloc] = Protego.parse(await r.text()) if r.status == 200 else None
            rp = robots[netloc]
            if rp is not None and not rp.can_fetch(url, USER_AGENT):
                continue
            while True:
                async with session.get(url) as r:
                    status, retry_after, body = (
                        r.status,
                        r.headers.get("Retry-After"),
                        await r.text(),
                    )
                if status == 503 and retry_503:
                    await asyncio.sleep(float(retry_after or 0) / 10)
                    continue
                break
            result[url] = status
            if status != 200:
                continue
            for a in LexborHTMLParser(body).css("a[href]"):
                href = a.attributes.get("href") or ""
                link = canonical_url(urljoin(url, href))
                if link.startswith("http://") and link.split("/")[2] in hosts and link not in seen:
                    seen.add(link)
                    queue.append(link)
    return result


# -- the spec (no server) --------------------------------------------------------------------------


def test_expected_has_canonical_urls_statuses_and_obeys_robots() -> None:
    spec = demo_spec(18080, HOSTS)
    exp = spec.expected()
    a, b, c = (f"http://{h}:18080" for h in HOSTS)

    assert all("#" not in u for u in exp)
    # the query-order variants collapse to one sorted URL
    assert exp[f"{a}/products.html?a=1&b=2"] == 200
    assert f"{a}/products.html?b=2&a=1" not in exp
    assert exp[f"{a}/products.html?page=2"] == 200
    # linked missing pages are stored as 404; the transiently failing page as its final 200
    assert exp[f"{a}/missing.html"] == 404
    assert exp[f"{b}/articles/gone.html"] == 404
    assert exp[f"{a}/flaky.html"] == 200
    # robots: /private/ is off limits where robots.txt exists, open on the host without one
    assert not any(u.startswith((f"{a}/private/", f"{b}/private/")) for u in exp)
    assert exp[f"{c}/private/secret.html"] == 200
    assert exp[f"{c}/private/deeper.html"] == 200
    # the crawlfleet-specific group on the second host applies to us
    assert f"{b}/drafts/plan.html" not in exp
    # non-HTTP links are never crawl targets
    assert all(u.startswith("http://") for u in exp)
    assert set(exp.values()) == {200, 404}
    assert 10 <= len([u for u in exp if u.startswith(a)]) <= 25


def test_expected_depth_and_same_target() -> None:
    spec = demo_spec(18080, HOSTS)
    full = spec.expected()
    assert spec.expected(max_depth=0) == {s: 200 for s in spec.seeds()}
    d1 = spec.expected(max_depth=1)
    assert set(d1) < set(full)
    assert "http://127.0.0.2:18080/about.html" in d1
    assert "http://127.0.0.2:18080/team.html" not in d1  # depth 2
    # from 127.0.0.2 alone, 127.0.0.3's about page is one hop away, but across targets
    one = spec.with_seeds(["http://127.0.0.2:18080/"])
    assert "http://127.0.0.3:18080/about.html" in one.expected(max_depth=1)
    assert "http://127.0.0.3:18080/team.html" not in one.expected(max_depth=1)
    same = one.expected(max_depth=1, same_target_only=True)
    assert "http://127.0.0.3:18080/about.html" not in same
    assert set(same) < set(one.expected(max_depth=1))
    # the deep chain is five hops from home
    assert "http://127.0.0.2:18080/deep/5.html" not in spec.expected(max_depth=4)
    assert "http://127.0.0.2:18080/deep/5.html" in spec.expected(max_depth=5)


def test_same_target_only_drops_pages_reachable_only_across_hosts() -> None:
    spec = demo_spec(18080, HOSTS).with_seeds(["http://127.0.0.2:18080/"])
    crossing = spec.expected()
    staying = spec.expected(same_target_only=True)
    assert any(u.startswith("http://127.0.0.3") for u in crossing)
    assert any(u.startswith("http://127.0.0.4") for u in crossing)
    assert staying == {u: s for u, s in crossing.items() if u.startswith("http://127.0.0.2:")}
    assert demo_spec(18080, HOSTS).seeds() != spec.seeds()  # the original is untouched


def test_page_lookup_accepts_any_spelling_of_a_url() -> None:
    spec = demo_spec(18080, HOSTS)
    page = spec.page("127.0.0.2", "/products.html?b=2&a=1#frag")
    assert page is not None
    assert page.path == "/products.html?a=1&b=2"
    assert spec.page("127.0.0.2", "/products.html") is None
    assert spec.page("127.0.0.2", "/nope.html") is None
    assert spec.page("127.0.0.9", "/") is None
    home = spec.page("127.0.0.2", "/")
    assert home is not None
    assert all(link.startswith("http://") for link in home.links)
    assert "http://127.0.0.2:18080/about.html" in home.links  # "about.html" resolved
    contact = spec.page("127.0.0.2", "/contact.html")
    assert contact is not None
    assert "mailto:hello@example.invalid" in contact.hrefs
    assert not any("mailto" in link or "javascript" in link for link in contact.links)


def test_bench_spec_is_fully_reachable_deterministic_and_sized() -> None:
    spec = bench_spec(18500, pages=500, hosts=4, page_bytes=12_000)
    assert spec.hosts == ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    exp = spec.expected()
    assert len(exp) == 500
    assert set(exp.values()) == {200}
    assert not any("/nofollow/" in u for u in exp)
    # some pages do link into the disallowed area, so robots handling is exercised
    pages = [spec.page(h, f"/p/{i}.html") for i, h in enumerate(spec.hosts * 125) if i >= 4]
    assert any("/nofollow/" in ln for p in pages if p for ln in p.links)
    page = spec.page("127.0.0.3", "/p/5.html")
    assert page is not None
    assert 10_000 <= len(spec.body(page)) <= 14_000
    assert bench_spec(18500, pages=500, hosts=4).page("127.0.0.3", "/p/5.html") == page
    # the page lives only on its own host, spelled one way
    assert spec.page("127.0.0.2", "/p/5.html") is None
    assert spec.page("127.0.0.3", "/p/05.html") is None
    assert spec.page("127.0.0.3", "/p/501.html") is None


def test_with_crawl_delay_applies_to_every_group() -> None:
    robots = with_crawl_delay("User-agent: crawlfleet\nDisallow: /a/\n\nUser-agent: *\n", 2.5)
    rp = Protego.parse(robots)
    assert rp.crawl_delay(USER_AGENT) == 2.5
    assert rp.crawl_delay("otherbot") == 2.5


# -- the running server ----------------------------------------------------------------------------


def test_serves_pages_robots_and_404(site: DemoSite, port: int) -> None:
    status, headers, body = get(f"http://127.0.0.3:{port}/about.html")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert "<title>About</title>" in body

    status, _, robots = get(f"http://127.0.0.2:{port}/robots.txt")
    assert status == 200
    assert not Protego.parse(robots).can_fetch(f"http://127.0.0.2:{port}/private/x", USER_AGENT)
    assert get(f"http://127.0.0.4:{port}/robots.txt")[0] == 404
    assert get(f"http://127.0.0.2:{port}/missing.html")[0] == 404
    # disallowed pages still exist: robots is advice the crawler must follow, not access control
    assert get(f"http://127.0.0.2:{port}/private/secret.html")[0] == 200


def test_counts_every_request_by_url_as_requested(site: DemoSite, port: int) -> None:
    a = f"http://127.0.0.2:{port}"
    before = time.monotonic()
    b1 = get(f"{a}/products.html?b=2&a=1")[2]
    b2 = get(f"{a}/products.html?a=1&b=2")[2]
    get(f"{a}/products.html?a=1&b=2")
    get(f"http://127.0.0.3:{port}/robots.txt")
    assert b1 == b2  # one page, two spellings
    assert site.requests[f"{a}/products.html?b=2&a=1"] == 1
    assert site.requests[f"{a}/products.html?a=1&b=2"] == 2
    assert site.requests[f"http://127.0.0.3:{port}/robots.txt"] == 1
    assert site.hits() == 4
    assert site.hits("127.0.0.2") == 3
    assert site.hits("127.0.0.4") == 0
    assert [(h, p) for _, h, p in site.request_log] == [
        ("127.0.0.2", "/products.html?b=2&a=1"),
        ("127.0.0.2", "/products.html?a=1&b=2"),
        ("127.0.0.2", "/products.html?a=1&b=2"),
        ("127.0.0.3", "/robots.txt"),
    ]
    assert all(t >= before for t, _, _ in site.request_log)
    assert site.max_rate("127.0.0.2") == 3
    assert site.max_rate("127.0.0.2", window=1e-9) == 1
    requests, log = site.snapshot()
    assert requests == site.requests
    assert log == site.request_log
    site.reset()
    assert site.hits() == 0
    assert not site.requests


def test_flaky_page_503s_twice_then_200_per_server_instance(port: int) -> None:
    url = f"http://127.0.0.2:{port}/flaky.html"
    with DemoSite(demo_spec(port, HOSTS)):
        first, second, third, fourth = (get(url) for _ in range(4))
        assert (first[0], second[0], third[0], fourth[0]) == (503, 503, 200, 200)
        assert first[1]["Retry-After"] == "1"
        assert "<title>Flaky</title>" in third[2]
    with DemoSite(demo_spec(port, HOSTS)):
        assert get(url)[0] == 503  # a fresh server starts flaky again


def test_crawl_delay_is_served_in_robots(port: int) -> None:
    with DemoSite(demo_spec(port, HOSTS), crawl_delay=0.5):
        robots = get(f"http://127.0.0.3:{port}/robots.txt")[2]
    rp = Protego.parse(robots)
    assert rp.crawl_delay(USER_AGENT) == 0.5
    assert not rp.can_fetch(f"http://127.0.0.3:{port}/drafts/plan.html", USER_AGENT)


def test_start_fails_loudly_when_port_taken_and_stop_frees_it(site: DemoSite, port: int) -> None:
    with pytest.raises(OSError):
        DemoSite(demo_spec(port, HOSTS)).start()
    site.stop()
    site.stop()  # idempotent
    with pytest.raises(aiohttp.ClientConnectionError):
        get(f"http://127.0.0.2:{port}/")
    with DemoSite(demo_spec(port, HOSTS)):  # the port is reusable at once
        assert get(f"http://127.0.0.2:{port}/")[0] == 200


def test_reference_crawl_of_demo_matches_expected(site: DemoSite, port: int) -> None:
    spec = site.spec
    got = asyncio.run(
        _reference_crawl(spec.seeds(), {f"{h}:{port}" for h in spec.hosts}, retry_503=True)
    )
    assert got == spec.expected()
    # robots obeyed: nothing disallowed was requested
    assert site.requests[f"http://127.0.0.2:{port}/private/secret.html"] == 0
    assert site.requests[f"http://127.0.0.3:{port}/drafts/plan.html"] == 0
    assert site.requests[f"http://127.0.0.2:{port}/flaky.html"] == 3


def test_reference_crawl_without_retries_sees_the_503(site: DemoSite, port: int) -> None:
    spec = site.spec
    got = asyncio.run(
        _reference_crawl(spec.seeds(), {f"{h}:{port}" for h in spec.hosts}, retry_503=False)
    )
    assert got[f"http://127.0.0.2:{port}/flaky.html"] == 503
    assert got != spec.expected()


def test_reference_crawl_of_small_bench_site_matches_expected() -> None:
    port = free_port(tuple(f"127.0.0.{2 + k}" for k in range(3)), start=18280)
    spec = bench_spec(port, pages=300, hosts=3, page_bytes=3_000)
    with DemoSite(spec) as site:
        got = asyncio.run(
            _reference_crawl(spec.seeds(), {f"{h}:{port}" for h in spec.hosts}, retry_503=True)
        )
        assert got == spec.expected()
        assert len(got) == 300
        # each page fetched exactly once, plus one robots.txt per host
        assert site.hits() == 300 + 3
        assert max(site.requests.values()) == 1


def test_rate_log_reports_per_host_requests(port: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sites.demo_server")
    with DemoSite(demo_spec(port, HOSTS), rate_limit_log=True):
        for _ in range(3):
            get(f"http://127.0.0.3:{port}/")
        time.sleep(1.3)
    assert "demo-site 127.0.0.3: 3 req/s" in caplog.messages
    assert not any("127.0.0.2" in m for m in caplog.messages)


def test_cli_serves_until_sigterm(port: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sites.demo_site", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "listening" in banner
        assert get(f"http://127.0.0.4:{port}/about.html")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- rate enforcement and the benchmark shapes ----------------------------------------------------


async def _burst(urls: list[str]) -> list[tuple[int, str | None]]:
    """GET ``urls`` one after another on one session, as fast as the loop allows."""
    out = []
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.get(url) as r:
                await r.read()
                out.append((r.status, r.headers.get("Retry-After")))
    return out


def test_rate_cap_answers_429_over_the_cap_and_counts_it(port: int) -> None:
    a, b = (f"http://{h}:{port}" for h in HOSTS[:2])
    with DemoSite(demo_spec(port, HOSTS), rate_cap=2) as site:
        got = asyncio.run(
            _burst([f"{a}/robots.txt", f"{a}/", f"{a}/about.html", f"{a}/", f"{b}/"])
        )
        # robots.txt counts against the cap; the third and fourth request within 1 s are over
        assert [s for s, _ in got] == [200, 200, 429, 429, 200]
        assert got[2][1] == "1"  # Retry-After
        assert site.rate_violations == {HOSTS[0]: 2}
        assert site.rate_limited == {HOSTS[0]: 2}
        assert site.violations() == 2
        assert site.violations(HOSTS[1]) == 0
        # refused requests are logged too, each beside the status it got
        assert [(raw, st) for _, _, raw, st in site.log_with_statuses()] == [
            ("/robots.txt", 200),
            ("/", 200),
            ("/about.html", 429),
            ("/", 429),
            ("/", 200),
        ]
        assert site.log_with_statuses(4) == site.log_with_statuses()[4:]
        time.sleep(1.0)
        assert asyncio.run(_burst([f"{a}/team.html"]))[0][0] == 200  # the window has passed
        site.reset()
        assert site.violations() == 0
        assert not site.statuses
        assert not site.rate_limited
        assert [s for s, _ in asyncio.run(_burst([f"{a}/", f"{a}/"]))] == [200, 200]


def test_rate_cap_spares_requests_spaced_at_the_cap(port: int) -> None:
    a = f"http://{HOSTS[0]}:{port}"

    async def spaced() -> list[int]:
        out = []
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                async with session.get(f"{a}/") as r:
                    out.append(r.status)
                await asyncio.sleep(0.5)
        return out

    with DemoSite(demo_spec(port, HOSTS), rate_cap={HOSTS[0]: 2.0}) as site:
        assert asyncio.run(spaced()) == [200] * 5
        assert site.violations() == 0


def test_rate_cap_can_count_without_refusing(port: int) -> None:
    a = f"http://{HOSTS[2]}:{port}"
    with DemoSite(demo_spec(port, HOSTS), rate_cap=1, rate_enforce=False) as site:
        got = asyncio.run(_burst([f"{a}/", f"{a}/about.html", f"{a}/team.html"]))
        assert [s for s, _ in got] == [200, 200, 200]
        assert site.rate_violations == {HOSTS[2]: 2}
        assert not site.rate_limited
    with pytest.raises(ValueError, match="rate caps"):
        DemoSite(demo_spec(port, HOSTS), rate_cap=0)


def test_mixed_shape_serves_its_404s_and_503s_once_per_server() -> None:
    spec0 = shape_spec("mixed-50", 0, scale=0.05)
    port = free_port(spec0.hosts, start=18380)
    spec = shape_spec("mixed-50", port, scale=0.05)
    flaky = next(p for h in spec.hosts for p in _pages_of(spec, h) if p.transient_503s)
    gone = next(p for h in spec.hosts for p in _pages_of(spec, h) if p.status == 404)
    with DemoSite(spec) as site:
        first, again = (get(spec.url(flaky.host, flaky.path)) for _ in range(2))
        assert (first[0], again[0]) == (503, 200)
        assert "Retry-After" not in first[1]  # a bare 503: a flaky page, not a site resting
        status, _, body = get(spec.url(gone.host, gone.path))
        assert status == 404
        assert "<a " not in body
        assert [st for *_, st in site.log_with_statuses()] == [503, 200, 404]


def _pages_of(spec: SiteSpec, host: str) -> list[Page]:
    assert isinstance(spec, ShapeSite)
    return [p for p in spec.all_pages() if p.host == host]


@pytest.mark.parametrize(("shape", "scale"), [("mixed-50", 0.05), ("deep-chain", 0.02)])
def test_reference_crawl_of_small_shapes_matches_expected(shape: str, scale: float) -> None:
    spec0 = shape_spec(shape, 0, scale=scale)
    port = free_port(spec0.hosts, start=18480)
    spec = shape_spec(shape, port, scale=scale)
    with DemoSite(spec) as site:
        got = asyncio.run(
            _reference_crawl(spec.seeds(), {f"{h}:{port}" for h in spec.hosts}, retry_503=True)
        )
        assert got == spec.expected()
        assert not any("/private/" in u for u in site.requests)
