"""Sitemaps as a frontier source (issue 45, part 4), on the real broker and store.

One site's sitemap index is published with ``crawlfleet publish --sitemap``; another site
names its sitemap in robots.txt (``Sitemap:``, followed with ``follow_sitemaps``) and is
seeded with its home page. The index holds every case at once: an urlset with ``lastmod``,
a ``.xml.gz`` file, an index nested past the depth cap, a decompression bomb, a malformed
sitemap, one robots.txt disallows, and listed URLs that are off-scope, private or
disallowed by robots.txt. The store holds exactly the listed pages that pass; each bad
sitemap is one dead letter with its reason; nothing else is lost, and nothing is fetched
twice or fetched that should not be. A listed ``lastmod`` sets the page's first revisit
interval under an adaptive policy (its age, clamped to the policy's bounds).
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from fleet_helpers import (
    CountingServer,
    Workers,
    create_all_topics,
    publish_seeds,
    query,
    read_topic,
    report,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from crawlfleet.fleet import settings_env
from infra.topics import topology_of
from schemas.codec import default_codec
from schemas.keys import listed_lastmod
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

HOST_A, HOST_B = "127.0.0.4", "127.0.0.5"
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
HTML = b"<html><head><title>p</title></head><body>a page</body></html>"


def _urlset(*urls: str, lastmod: str | None = None) -> bytes:
    mod = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
    return (f"<?xml version='1.0'?><urlset {NS}>" + "".join(
        f"<url><loc>{u}</loc>{mod}</url>" for u in urls) + "</urlset>").encode()


def _index(*urls: str) -> bytes:
    return (f"<?xml version='1.0'?><sitemapindex {NS}>" + "".join(
        f"<sitemap><loc>{u}</loc></sitemap>" for u in urls) + "</sitemapindex>").encode()


def _site_a(base: str, off_scope: str) -> dict[str, tuple[int, bytes]]:
    pages = [f"/a{i}" for i in range(4)] + [f"/g{i}" for i in range(3)] + ["/n1"]
    routes = {p: (200, HTML) for p in pages}
    routes.update({
        # Its own Sitemap: line names the published index again: deduplicated, one fetch.
        "/robots.txt": (200, f"User-agent: *\nDisallow: /private\nSitemap: {base}/index.xml\n"
                        .encode()),
        "/index.xml": (200, _index(*(base + p for p in (
            "/s1.xml", "/s2.xml.gz", "/nest1.xml", "/bomb.xml.gz", "/broken.xml",
            "/private/sm.xml")))),  # a sitemap robots.txt disallows: never fetched
        "/s1.xml": (200, _urlset(*(base + f"/a{i}" for i in range(4)), base + "/private/x",
                                 off_scope + "/elsewhere", "http://10.0.0.7/internal",
                                 lastmod="2026-11-02T08:00:00Z")),
        "/s2.xml.gz": (200, gzip.compress(_urlset(*(base + f"/g{i}" for i in range(3))))),
        "/nest1.xml": (200, _index(base + "/leaf.xml", base + "/nest2.xml")),  # depth 1
        "/leaf.xml": (200, _urlset(base + "/n1")),  # depth 2: the cap, still expanded
        "/nest2.xml": (200, _index(base + "/nest3.xml")),  # depth 2: lists depth 3
        "/nest3.xml": (200, _urlset(base + "/never")),
        "/bomb.xml.gz": (200, gzip.compress(b"<" + b" " * (3 * 1024 * 1024))),
        "/broken.xml": (200, _urlset(base + "/never2")[:-20]),
    })
    return routes


def _site_b(base: str) -> dict[str, tuple[int, bytes]]:
    routes = {p: (200, HTML) for p in ("/", "/b0", "/b1", "/b2")}
    routes["/robots.txt"] = (200, b"User-agent: *\nAllow: /\nSitemap: /sm.xml\n"
                                  b"Sitemap: http://10.0.0.8/s.xml\n")
    routes["/sm.xml"] = (200, b"\n".join((base + p).encode() for p in ("/b0", "/b1", "/b2")))
    return routes


def test_a_crawl_from_a_published_sitemap_and_from_robots_sitemap_lines(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    started = time.monotonic()
    port = free_port((HOST_A, HOST_B), 19400)
    # No private address is allowed but the two loopback sites': 10.x must be refused.
    s = settings.replace(allow_private=False, allow_hosts=(HOST_A, HOST_B),
                         follow_sitemaps=True, sitemap_max_depth=2,
                         sitemap_max_bytes=1024 * 1024, revisit="adaptive 1h..7d")
    a, b = f"http://{HOST_A}:{port}", f"http://{HOST_B}:{port}"
    create_all_topics(s)
    ws = fleet(s)
    with CountingServer(HOST_A, port, _site_a(a, f"http://127.0.0.9:{port}")) as site_a, \
            CountingServer(HOST_B, port, _site_b(b)) as site_b:
        ws.start_pipeline()
        ws.start("revisit")  # holds the next visits (due in hours: none is made here)
        listed_at = time.time()
        env = {**os.environ, **settings_env(s)}
        env.pop("CRAWLFLEET_CONFIG", None)
        out = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "publish", "--sitemap",
                              a + "/index.xml"], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert "published 1," in out.stdout
        publish_seeds(s, [b + "/"])

        expected = {**{a + p: 200 for p in (*(f"/a{i}" for i in range(4)),
                                            *(f"/g{i}" for i in range(3)), "/n1")},
                    **{b + p: 200 for p in ("/", "/b0", "/b1", "/b2")}}
        wait_until(lambda: len(stored_pages(s)) >= len(expected), 45, "every listed page")
        drain_s = wait_drained(s, ws, 30)
        assert stored_pages(s) == expected  # no sitemap is stored as a page

        dead = sorted((str(r[0]), str(r[1])) for r in query(
            s, "SELECT reason, url FROM dead_letters FINAL"))
        assert dead == sorted([("sitemap_too_deep", a + "/nest3.xml"),
                               ("sitemap_too_large", a + "/bomb.xml.gz"),
                               ("sitemap_malformed", a + "/broken.xml"),
                               ("robots_disallowed", a + "/private/x"),
                               ("robots_disallowed", a + "/private/sm.xml")])
        # Each sitemap fetched once (the robots.txt line repeating the published index
        # included); nothing past the depth cap, disallowed or off the list fetched.
        for path in ("/index.xml", "/s1.xml", "/s2.xml.gz", "/nest1.xml", "/leaf.xml",
                     "/nest2.xml", "/bomb.xml.gz", "/broken.xml", "/robots.txt"):
            assert site_a.count(path) == 1, (path, site_a.requests)
        assert site_a.count("/nest3.xml") == site_a.count("/private/x") == 0
        assert site_a.count("/private/sm.xml") == 0
        assert site_b.count("/sm.xml") == 1 and site_b.count("/robots.txt") == 1
        sitemap_events = query(s, "SELECT count() FROM fetch_events "
                                  "WHERE url LIKE '%.xml%' AND status = 200")
        assert sitemap_events[0][0] == 9  # 8 of site a (not nest3), sm.xml of site b

        # lastmod travels in the page's job (for the revisit policy).
        codec = default_codec()
        jobs = [codec.decode("CrawlJob", r.value, r.headers)
                for r in read_topic(s, topology_of(s).frontier)]
        mods = {j["url"]: listed_lastmod(j) for j in jobs if j["kind"] == "page"}
        assert mods[a + "/a0"] == "2026-11-02T08:00:00+00:00" and mods[a + "/g0"] is None
        assert not any("10.0.0." in j["url"] or "127.0.0.9" in j["url"] for j in jobs)
        # ... and sets the first revisit interval: the page's age at its visit, clamped to
        # [1h, 7d]; a page listed without one starts at 1h.
        nxt = {j["url"]: j["delay_ms"] / 1000 for j in (
            codec.decode("CrawlJob", r.value, r.headers)
            for r in read_topic(s, topology_of(s).revisits))}
        assert set(nxt) == set(expected)
        mod_s = datetime.fromisoformat(mods[a + "/a0"]).timestamp()
        low, high = (min(7 * 86400.0, max(3600.0, t - mod_s))
                     for t in (listed_at, time.time()))
        assert all(low - 1 <= nxt[a + f"/a{i}"] <= high + 1 for i in range(4)), nxt
        assert nxt[a + "/g0"] == nxt[b + "/b0"] == 3600, nxt
        assert all(w.alive() for w in ws.all.values()), ws.logs()
    report("sitemap_crawl", pages=len(expected), dead=len(dead), drain_s=round(drain_s, 1),
           total_s=round(time.monotonic() - started, 1))
