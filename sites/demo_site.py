"""A local multi-host website for crawler tests, demos and benchmarks.

Linux routes all of 127.0.0.0/8 to ``lo``, so every "host" of the site is a distinct loopback
IP bound on the same port: each is a separate crawl target with its own robots.txt and its own
politeness budget, yet nothing ever leaves the machine.

The content (:class:`SiteSpec`) is pure data, so tests can compute the exact set of URLs a
correct crawler must store (:meth:`SiteSpec.expected`) without running a server; the server
(:class:`DemoSite`) only serves that data and counts what it was asked for.

Run ``python -m sites.demo_site --port 18080`` to serve the small demo site until Ctrl-C
(``--bench`` the generated benchmark site, ``--shape NAME`` one of the shapes of
``bench.shapes_bench``, the skewed one with its rate cap enforced).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import html
import logging
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import TracebackType
from typing import Self
from urllib.parse import urljoin, urlsplit

from aiohttp import web
from protego import Protego
from w3lib.url import canonicalize_url

__all__ = [
    "RATE_SLACK_S",
    "SHAPES",
    "USER_AGENT",
    "ChainSite",
    "DemoSite",
    "MixedSite",
    "Page",
    "ShapeSite",
    "SiteSpec",
    "SkewedSite",
    "bench_spec",
    "canonical_url",
    "demo_spec",
    "free_port",
    "serve_forever",
    "shape_spec",
    "with_crawl_delay",
]

log = logging.getLogger(__name__)

#: the robots.txt user-agent token the crawler identifies itself with
USER_AGENT = "crawlfleet"

#: how much shorter than 1 s the window of DemoSite's rate cap is (absorbs arrival jitter)
RATE_SLACK_S = 0.05

_HTML = "text/html; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"


@lru_cache(maxsize=200_000)
def canonical_url(url: str) -> str:
    """The one canonical form every expectation is keyed by.

    Sorted query, no fragment, percent-encoding normalised (w3lib's rules, the de-facto standard
    for crawlers), so ``?b=2&a=1#x`` and ``?a=1&b=2`` are one URL.
    """
    return str(canonicalize_url(url))


@dataclass(frozen=True)
class Page:
    """One page of the site.

    ``links`` are the page's ``<a href>`` targets resolved to absolute URLs, exactly as a parser
    would see them (fragments and query order kept; non-HTTP schemes left out). ``hrefs`` are the
    attribute values as written in the HTML (relative, ``mailto:`` ...), empty meaning "write
    ``links`` as they are". ``transient_503s`` is how many first requests answer 503 before the
    page answers ``status``.
    """

    host: str
    path: str
    status: int
    links: tuple[str, ...]
    hrefs: tuple[str, ...] = ()
    title: str = ""
    transient_503s: int = 0


class SiteSpec:
    """The site's content: hosts, robots.txt per host and pages. Pure data, no I/O.

    Subclasses decide where pages come from (a table, or generated on demand); everything that
    derives from content (lookups by any URL spelling, the expected crawl) lives here.
    """

    #: Retry-After of a page's one-off 503s (None: a bare 503, a flaky backend's answer).
    transient_retry_after: str | None = "1"

    def __init__(self, hosts: Iterable[str], port: int, robots: Mapping[str, str | None]) -> None:
        self.hosts: tuple[str, ...] = tuple(hosts)
        self.port: int = port
        self._robots = dict(robots)
        self._netlocs = {f"{h}:{port}": h for h in self.hosts}
        self._seeds: tuple[str, ...] | None = None

    # -- content -------------------------------------------------------------------------------

    def url(self, host: str, path: str = "/") -> str:
        """Absolute URL of ``path`` (which may carry a query) on ``host``."""
        return f"http://{host}:{self.port}{path}"

    def seeds(self) -> list[str]:
        """One seed per host, its home page, unless :meth:`with_seeds` chose others."""
        if self._seeds is not None:
            return list(self._seeds)
        return [self.url(h, "/") for h in self.hosts]

    def with_seeds(self, seeds: Iterable[str]) -> Self:
        """The same site started from other seeds, e.g. one host, to test link discovery."""
        other = copy.copy(self)
        other._seeds = tuple(seeds)
        return other

    def robots_txt(self, host: str) -> str | None:
        """robots.txt body for ``host``; None means the host answers 404 for it."""
        return self._robots.get(host)

    def page(self, host: str, path: str) -> Page | None:
        """The page at ``path`` (with optional query, in any order, any fragment) or None: 404."""
        canon = canonical_url(self.url(host, path))
        return self._lookup(host, canon[len(self.url(host, "")) :])

    def body(self, page: Page) -> bytes:
        """The HTML the server sends for ``page``."""
        raise NotImplementedError

    def _lookup(self, host: str, canonical_path: str) -> Page | None:
        raise NotImplementedError

    # -- expectations --------------------------------------------------------------------------

    def expected(
        self, max_depth: int | None = None, same_target_only: bool = False
    ) -> dict[str, int]:
        """``{canonical_url: status}`` a correct, polite crawler stores when started at seeds().

        Breadth-first over links, seeds at depth 0, a page's links at its depth + 1, pages
        deeper than ``max_depth`` not fetched. robots.txt is obeyed for user-agent
        ``crawlfleet`` (a disallowed URL is neither fetched nor stored). Linked missing pages
        are stored with 404; transiently failing pages with their final status (retries
        succeed). ``same_target_only`` follows only links to the host of the page they are on.
        Links off the site (other hosts or ports) are never followed.
        """
        parsers = {h: Protego.parse(r) for h in self.hosts if (r := self.robots_txt(h)) is not None}
        prefix_len = {h: len(self.url(h, "")) for h in self.hosts}

        def allowed(host: str, url: str) -> bool:
            rp = parsers.get(host)
            return rp is None or bool(rp.can_fetch(url, USER_AGENT))

        result: dict[str, int] = {}
        seen: set[str] = set()
        queue: deque[tuple[str, str, int]] = deque()
        for seed in self.seeds():
            canon = canonical_url(seed)
            host = self._site_host(canon)
            if host is not None and canon not in seen:
                seen.add(canon)
                queue.append((canon, host, 0))
        while queue:
            url, host, depth = queue.popleft()
            if not allowed(host, url):
                continue
            page = self._lookup(host, url[prefix_len[host] :])
            result[url] = page.status if page is not None else 404
            if page is None or (max_depth is not None and depth >= max_depth):
                continue
            for link in page.links:
                canon = canonical_url(link)
                if canon in seen:
                    continue
                link_host = self._site_host(canon)
                if link_host is None or (same_target_only and link_host != host):
                    continue
                seen.add(canon)
                queue.append((canon, link_host, depth + 1))
        return result

    def _site_host(self, url: str) -> str | None:
        """The site host serving ``url``, or None if it is off the site (or not HTTP)."""
        parts = urlsplit(url)
        if parts.scheme != "http":
            return None
        return self._netlocs.get(parts.netloc)


# -- rendering -------------------------------------------------------------------------------------

# one string is easier to read than 36 one-word lines
_WORDS = (  # noqa: SIM905
    "crawler frontier politeness robots canonical fetch parse queue partition broker offset "
    "stream consumer producer latency throughput backoff retry schema record topic lag host "
    "delay token bucket page link anchor title render archive index shard replica commit"
).split()


def _paragraphs(count: int, words_per: int, salt: int) -> list[str]:
    """Deterministic filler prose: realistic enough for text extraction to do real work."""
    out = []
    x = salt * 2654435761 + 1
    for _ in range(count):
        words = []
        for _ in range(words_per):
            x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
            words.append(_WORDS[(x >> 33) % len(_WORDS)])
        out.append(" ".join(words).capitalize() + ".")
    return out


def _render(title: str, hrefs: Iterable[str], paragraphs: Iterable[str], filler: str = "") -> str:
    items = "".join(f'<li><a href="{html.escape(h)}">{html.escape(h)}</a></li>\n' for h in hrefs)
    text = "".join(f"<p>{html.escape(p)}</p>\n" for p in paragraphs)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
        f"{text}<nav><ul>\n{items}</ul></nav>\n{filler}</body></html>\n"
    )


def _resolve(page_url: str, hrefs: Iterable[str]) -> tuple[str, ...]:
    """What a parser gets from ``hrefs``: absolute HTTP URLs, as written otherwise."""
    out = []
    for h in hrefs:
        absolute = urljoin(page_url, h)
        if absolute.startswith(("http://", "https://")):
            out.append(absolute)
    return tuple(out)


# -- the small demo ------------------------------------------------------------------------------


class _StaticSite(SiteSpec):
    """A site held as a table of pages, with bodies rendered once up front."""

    def __init__(
        self,
        hosts: Iterable[str],
        port: int,
        robots: Mapping[str, str | None],
        pages: Iterable[tuple[Page, str]],
    ) -> None:
        super().__init__(hosts, port, robots)
        self._pages: dict[tuple[str, str], Page] = {}
        self._bodies: dict[tuple[str, str], bytes] = {}
        for i, (p, text) in enumerate(pages):
            key = (p.host, p.path)
            self._pages[key] = p
            paras = [text, *_paragraphs(2, 24, i)]
            self._bodies[key] = _render(p.title, p.hrefs or p.links, paras).encode()

    def _lookup(self, host: str, canonical_path: str) -> Page | None:
        return self._pages.get((host, canonical_path))

    def body(self, page: Page) -> bytes:
        return self._bodies[(page.host, page.path)]

    def all_pages(self) -> list[Page]:
        """Every page that exists (linked or not, allowed or not): for tests."""
        return list(self._pages.values())


def demo_spec(
    port: int, hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
) -> SiteSpec:
    """The small demo: ~20 pages per host that exercise everything a polite crawler must handle.

    Every host: robots.txt disallowing ``/private/`` (linked from its home page), links to two
    missing pages (404), relative/absolute/fragment links, ``/products.html`` linked with its
    query in two orders, ``mailto:``/``javascript:`` links, a 5-deep chain under ``/deep/``, and
    links to the next host (cross-target). Special hosts:

    * ``hosts[0]``: ``/flaky.html`` answers 503 (Retry-After: 1) twice, then 200.
    * ``hosts[1]`` (with >= 3 hosts): robots.txt has a ``crawlfleet`` group that also disallows
      ``/drafts/`` (linked), so user-agent matching matters.
    * ``hosts[-1]`` (with >= 2 hosts): no robots.txt (404), so its ``/private/`` pages are
      crawlable.
    """
    robots: dict[str, str | None] = {}
    pages: list[tuple[Page, str]] = []
    for i, host in enumerate(hosts):
        base = f"http://{host}:{port}"
        nxt = hosts[(i + 1) % len(hosts)]
        nxt_base = f"http://{nxt}:{port}"
        flaky = i == 0
        drafts = i == 1 and len(hosts) >= 3
        no_robots = i == len(hosts) - 1 and len(hosts) >= 2

        if no_robots:
            robots[host] = None
        elif drafts:
            robots[host] = (
                "# crawlfleet gets its own group; others follow *\n"
                f"User-agent: {USER_AGENT}\nDisallow: /private/\nDisallow: /drafts/\n\n"
                "User-agent: *\nDisallow: /private/\n"
            )
        else:
            robots[host] = "User-agent: *\nDisallow: /private/\nAllow: /\n"

        def add(
            path: str,
            title: str,
            hrefs: list[str],
            *,
            text: str = "",
            transient_503s: int = 0,
            _host: str = host,
            _base: str = base,
        ) -> None:
            page = Page(
                host=_host,
                path=path,
                status=200,
                links=_resolve(_base + path, hrefs),
                hrefs=tuple(hrefs),
                title=title,
                transient_503s=transient_503s,
            )
            pages.append((page, text or f"{title} on {_host}."))

        home = [
            "about.html",
            "/articles/",
            "/products.html?b=2&a=1",
            f"{base}/products.html?a=1&b=2#reviews",
            "contact.html#form",
            "/private/secret.html",
            "deep/1.html",
            f"{nxt_base}/",
            f"{nxt_base}/about.html#team",
            "#top",
        ]
        if flaky:
            home.append("/flaky.html")
        if drafts:
            home.append("/drafts/plan.html")
        add("/", f"Home of {host}", home, text="Welcome to the crawlfleet demo site.")
        add("/about.html", "About", ["/", "./team.html", "/missing.html", f"{base}/about.html#x"])
        add("/team.html", "Team", ["about.html", "/", "mailto:team@example.invalid"])
        add(
            "/contact.html",
            "Contact",
            ["mailto:hello@example.invalid", "javascript:void(0)", "#form", "/"],
        )
        articles = ["1.html", "2.html", "3.html", f"{base}/articles/4.html", "../"]
        add("/articles/", "Articles", articles)
        for k in range(1, 6):
            hrefs = ["/articles/", "../about.html"]
            if k < 5:
                hrefs.insert(0, f"{k + 1}.html")
            if k == 3:
                hrefs.append("/articles/gone.html")
            add(f"/articles/{k}.html", f"Article {k}", hrefs)
        add(
            "/products.html?a=1&b=2",
            "Products",
            ["?page=2", "products.html?a=1&b=2#top", "/"],
        )
        add("/products.html?page=2", "Products, page 2", ["/products.html?b=2&a=1", "/"])
        add("/private/secret.html", "Secret", ["deeper.html", "/"])
        add("/private/deeper.html", "Deeper secret", ["/"])
        for k in range(1, 6):
            add(f"/deep/{k}.html", f"Deep {k}", [f"{k + 1}.html" if k < 5 else "/"])
        if flaky:
            add("/flaky.html", "Flaky", ["/"], transient_503s=2)
        if drafts:
            add("/drafts/plan.html", "Draft plan", ["/"])
    return _StaticSite(hosts, port, robots, pages)


# -- the generated benchmark site ----------------------------------------------------------------


def _mix(x: int) -> int:
    """splitmix64 finaliser: a cheap deterministic pseudo-random link target."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _filler_variants(target: int, variants: int) -> list[str]:
    """``variants`` HTML filler blocks of ~``target`` bytes each, to pad generated pages."""
    out: list[str] = []
    for v in range(variants):
        paras, size = [], 0
        for p in _paragraphs(max(1, target // 300 + 1), 40, v):
            if size >= target:
                break
            paras.append(f"<p>{p}</p>\n")
            size += len(paras[-1])
        out.append("".join(paras))
    return out


class _GeneratedSite(SiteSpec):
    """``n`` pages spread round-robin over hosts, generated on demand (no per-page storage).

    Page ``i`` lives on ``hosts[i % H]`` at ``/`` for the first page of each host, else at
    ``/p/<i>.html``; it links to ``i + 1`` (so everything is reachable from seed 0) and to
    ``links_per_page - 1`` pseudo-random pages; every 97th page also links into ``/nofollow/``.
    """

    _FILLER_VARIANTS = 32

    def __init__(
        self, hosts: tuple[str, ...], port: int, n: int, page_bytes: int, links_per_page: int
    ) -> None:
        robots = {h: "User-agent: *\nDisallow: /nofollow/\n" for h in hosts}
        super().__init__(hosts, port, robots)
        self.n = n
        self.links_per_page = links_per_page
        self._host_index = {h: i for i, h in enumerate(hosts)}
        # Filler is built once: page generation must stay far cheaper than serving it.
        self._filler = _filler_variants(
            max(0, page_bytes - 600 - 60 * links_per_page), self._FILLER_VARIANTS
        )

    def _path(self, i: int) -> str:
        return "/" if i < len(self.hosts) else f"/p/{i}.html"

    def _index(self, host: str, canonical_path: str) -> int | None:
        h = self._host_index.get(host)
        if h is None:
            return None
        if canonical_path == "/":
            return h if h < self.n else None
        if not (canonical_path.startswith("/p/") and canonical_path.endswith(".html")):
            return None
        digits = canonical_path[3:-5]
        if not digits.isdigit() or str(int(digits)) != digits:
            return None
        i = int(digits)
        if i < len(self.hosts) or i >= self.n or i % len(self.hosts) != h:
            return None
        return i

    def _lookup(self, host: str, canonical_path: str) -> Page | None:
        i = self._index(host, canonical_path)
        if i is None:
            return None
        hcount = len(self.hosts)
        targets = [i + 1] if i + 1 < self.n else [0]
        targets += [_mix(i * 131 + k) % self.n for k in range(1, self.links_per_page)]
        hrefs = []
        for j in targets:
            jhost = self.hosts[j % hcount]
            hrefs.append(self._path(j) if jhost == host else self.url(jhost, self._path(j)))
        if i % 97 == 5:
            hrefs.append(f"/nofollow/{i}.html")
        return Page(
            host=host,
            path=canonical_path,
            status=200,
            links=tuple(h if h.startswith("http") else self.url(host, h) for h in hrefs),
            hrefs=tuple(hrefs),
            title=f"Page {i}",
        )

    def body(self, page: Page) -> bytes:
        i = self._index(page.host, page.path)
        salt = 0 if i is None else i
        intro = _paragraphs(1, 30, salt + 1_000_003)
        filler = self._filler[salt % self._FILLER_VARIANTS]
        return _render(page.title, page.hrefs, intro, filler).encode()


def bench_spec(
    port: int,
    pages: int = 10_000,
    hosts: int = 8,
    page_bytes: int = 12_000,
    links_per_page: int = 10,
) -> SiteSpec:
    """A generated site of ``pages`` ~``page_bytes`` HTML pages on hosts 127.0.0.2..(1+hosts).

    Every page is reachable from the seeds; robots.txt on each host disallows ``/nofollow/``,
    which about 1% of pages link into. Deterministic: same arguments, same site.
    """
    if not 1 <= hosts <= 253:
        raise ValueError(f"hosts must be 1..253, got {hosts}")
    if pages < hosts:
        raise ValueError(f"need at least one page per host ({pages=} < {hosts=})")
    host_ips = tuple(f"127.0.0.{2 + k}" for k in range(hosts))
    return _GeneratedSite(host_ips, port, pages, page_bytes, links_per_page)


# -- generated benchmark shapes --------------------------------------------------------------------

#: shape names for :func:`shape_spec`, in the order the shapes benchmark runs them
SHAPES = ("few-large", "mixed-50", "deep-chain", "skewed-polite")

_PRIVATE_ROBOTS = "User-agent: *\nDisallow: /private/\n"


def _loopback_hosts(n: int) -> tuple[str, ...]:
    if not 1 <= n <= 253:
        raise ValueError(f"hosts must be 1..253, got {n}")
    return tuple(f"127.0.0.{2 + k}" for k in range(n))


class ShapeSite(SiteSpec):
    """Pages numbered per host and generated on demand: ``/`` is page 0, ``/p/<k>.html`` page k.

    Everything about a page (links, status, a one-off 503) is a pure function of its host's
    index and its number, so a shape of 20,000 pages is deterministic and costs no memory per
    page. Subclasses say what a page links to (:meth:`_hrefs`) and which pages fail. Every host
    also has ``/private/<k>.html`` pages, which robots.txt disallows: a crawler ignoring robots
    finds real pages there, and the request log shows it.
    """

    _FILLER_VARIANTS = 32

    def __init__(
        self,
        name: str,
        hosts: tuple[str, ...],
        port: int,
        pages_per_host: Iterable[int],
        page_bytes: int,
        robots: str | None = _PRIVATE_ROBOTS,
    ) -> None:
        super().__init__(hosts, port, dict.fromkeys(hosts, robots))
        self.name = name
        self.pages_per_host: tuple[int, ...] = tuple(pages_per_host)
        if len(self.pages_per_host) != len(hosts) or min(self.pages_per_host) < 1:
            raise ValueError("need a page count >= 1 for every host")
        self._host_index = {h: i for i, h in enumerate(hosts)}
        # ~20 links of ~60 bytes and the page's frame come on top of the filler
        self._filler = _filler_variants(max(0, page_bytes - 1_500), self._FILLER_VARIANTS)

    @staticmethod
    def path(k: int) -> str:
        """Path of page ``k`` on its host."""
        return "/" if k == 0 else f"/p/{k}.html"

    def page_url(self, h: int, k: int) -> str:
        """Absolute URL of page ``k`` on ``hosts[h]``."""
        return self.url(self.hosts[h], self.path(k))

    def all_pages(self) -> list[Page]:
        """Every numbered page (not the private ones), linked or not: for tests."""
        out = []
        for h, host in enumerate(self.hosts):
            for k in range(self.pages_per_host[h]):
                page = self._lookup(host, self.path(k))
                assert page is not None
                out.append(page)
        return out

    # -- what subclasses decide ----------------------------------------------------------------

    def _hrefs(self, h: int, k: int) -> list[str]:
        raise NotImplementedError

    def _status(self, h: int, k: int) -> int:
        return 200

    def _transient_503s(self, h: int, k: int) -> int:
        return 0

    # -- lookups -------------------------------------------------------------------------------

    def _rand(self, h: int, k: int, purpose: int) -> int:
        return _mix((h << 40) ^ (k << 8) ^ purpose)

    def _parse(self, host: str, canonical_path: str) -> tuple[int, int, bool] | None:
        """(host index, page number, private?) of a canonical path, or None if no such page."""
        h = self._host_index.get(host)
        if h is None:
            return None
        if canonical_path == "/":
            return h, 0, False
        for prefix, private in (("/p/", False), ("/private/", True)):
            if canonical_path.startswith(prefix) and canonical_path.endswith(".html"):
                digits = canonical_path[len(prefix) : -5]
                if not digits.isdigit() or str(int(digits)) != digits:
                    return None
                k = int(digits)
                if k >= self.pages_per_host[h] or (k == 0 and not private):
                    return None
                return h, k, private
        return None

    def _lookup(self, host: str, canonical_path: str) -> Page | None:
        parsed = self._parse(host, canonical_path)
        if parsed is None:
            return None
        h, k, private = parsed
        if private:
            return Page(host, canonical_path, 200, (self.url(host, "/"),), ("/",), f"Private {k}")
        status = self._status(h, k)
        if status != 200:  # an error page: no links, so no crawler must parse one to finish
            return Page(host, canonical_path, status, (), (), f"Error {status}")
        hrefs = self._hrefs(h, k)
        return Page(
            host=host,
            path=canonical_path,
            status=200,
            links=tuple(x if x.startswith("http") else self.url(host, x) for x in hrefs),
            hrefs=tuple(hrefs),
            title=f"{self.name} {h}/{k}",
            transient_503s=self._transient_503s(h, k),
        )

    def body(self, page: Page) -> bytes:
        parsed = self._parse(page.host, page.path)
        h, k = (parsed[0], parsed[1]) if parsed is not None else (0, 0)
        if page.status != 200:
            return _render(page.title, (), [f"{page.path} is not here."]).encode()
        salt = self._rand(h, k, 0)
        intro = _paragraphs(1, 30, salt % 1_000_003)
        return _render(
            page.title, page.hrefs, intro, self._filler[salt % self._FILLER_VARIANTS]
        ).encode()


class MixedSite(ShapeSite):
    """Many mid-sized hosts with the failures a real crawl meets.

    Page ``k`` of a host links to ``k + 1`` and ``k + 2`` (so everything is reachable past
    any one 404) and to more pages of its host, 10-20 same-host links in all, plus 1-2 pages
    of other hosts. About 3% of pages answer 404 (odd ``k`` only, so no two are adjacent;
    linked, without links), about 3% answer 503 once before their 200 (a bare 503, as from a
    flaky backend: a site asking for rest would send Retry-After, which a polite crawler obeys
    for the whole site), and about 25% link into ``/private/``, which robots.txt disallows.
    """

    transient_retry_after = None

    def _status(self, h: int, k: int) -> int:
        return 404 if k % 2 == 1 and self._rand(h, k, 1) % 100 < 6 else 200

    def _transient_503s(self, h: int, k: int) -> int:
        return 1 if self._rand(h, k, 2) % 100 < 3 else 0

    def _hrefs(self, h: int, k: int) -> list[str]:
        n = self.pages_per_host[h]
        r = self._rand(h, k, 3)
        targets = [t for t in (k + 1, k + 2) if t < n]
        x = r
        for _ in range(10 + r % 11 - len(targets)):
            x = _mix(x)
            targets.append(x % n)
        hrefs = [self.path(t) for t in targets]
        others = len(self.hosts) - 1
        for _ in range(1 + (r >> 8) % 2 if others else 0):
            x = _mix(x)
            oh = x % others
            oh += oh >= h
            hrefs.append(self.page_url(oh, (x >> 20) % self.pages_per_host[oh]))
        if (r >> 16) % 4 == 0:
            hrefs.append(f"/private/{k}.html")
        return hrefs


class ChainSite(ShapeSite):
    """One long chain across the hosts: the crawl is deep, with little to do at each level.

    Chain page ``i`` is page ``i // H`` of host ``i % H``; it links to ``i + 1``, to ``i + 2``
    on every third page, and back to ``i - 5`` (already seen), so the breadth-first depth is
    about three quarters of the page count and each level holds one or two pages.
    """

    def __init__(self, hosts: tuple[str, ...], port: int, pages: int, page_bytes: int) -> None:
        n_hosts = len(hosts)
        if pages < n_hosts:
            raise ValueError(f"need at least one page per host ({pages=} < {n_hosts})")
        per_host = [(pages - h + n_hosts - 1) // n_hosts for h in range(n_hosts)]
        super().__init__("deep-chain", hosts, port, per_host, page_bytes)
        self.pages = pages

    def chain_url(self, i: int) -> str:
        """URL of chain page ``i``."""
        return self.page_url(i % len(self.hosts), i // len(self.hosts))

    def _hrefs(self, h: int, k: int) -> list[str]:
        i = k * len(self.hosts) + h
        targets = [i + 1] if i + 1 < self.pages else [0]
        if i % 3 == 0 and i + 2 < self.pages:
            targets.append(i + 2)
        if i >= 5:
            targets.append(i - 5)
        return [
            self.path(j // len(self.hosts)) if j % len(self.hosts) == h else self.chain_url(j)
            for j in targets
        ]


class SkewedSite(ShapeSite):
    """One big host beside many small ones, every host capped at ``cap`` requests/s.

    The big host's whole URL list comes first in :meth:`seeds` (as from a sitemap export),
    then the small hosts' home pages. A small host's home links to all its pages and to one
    disallowed ``/private/`` page; its pages link home and onwards. A crawler that queues
    work in seed order meets the big host's backlog before any small host: only one that
    keeps per-host queues finishes the small hosts in about their own bound.
    """

    def __init__(
        self,
        hosts: tuple[str, ...],
        port: int,
        big_pages: int,
        small_pages: int,
        page_bytes: int,
        cap: float,
    ) -> None:
        if len(hosts) < 2:
            raise ValueError("need the big host and at least one small host")
        if cap <= 0:
            raise ValueError(f"cap must be > 0, got {cap}")
        per_host = [big_pages] + [small_pages] * (len(hosts) - 1)
        super().__init__("skewed-polite", hosts, port, per_host, page_bytes)
        self.cap = cap

    @property
    def big_host(self) -> str:
        return self.hosts[0]

    @property
    def small_hosts(self) -> tuple[str, ...]:
        return self.hosts[1:]

    def seeds(self) -> list[str]:
        if self._seeds is not None:
            return super().seeds()
        big = [self.page_url(0, k) for k in range(self.pages_per_host[0])]
        return big + [self.url(h, "/") for h in self.small_hosts]

    def _hrefs(self, h: int, k: int) -> list[str]:
        n = self.pages_per_host[h]
        if h == 0:
            x = self._rand(h, k, 4)
            targets = [k + 1 if k + 1 < n else 0]
            for _ in range(3):
                x = _mix(x)
                targets.append(x % n)
            return [self.path(t) for t in targets]
        if k == 0:
            return [*(self.path(t) for t in range(1, n)), "/private/0.html"]
        return ["/", self.path(k + 1 if k + 1 < n else 1)]


def shape_spec(
    name: str, port: int, scale: float = 1.0, page_bytes: int = 12_000
) -> SiteSpec:
    """The shape ``name`` of :data:`SHAPES`, its page counts multiplied by ``scale``.

    * ``few-large``: 2 hosts x 5,000 pages (the throughput site, few targets);
    * ``mixed-50``: 50 hosts x 400 pages with 404s, one-off 503s and disallowed links;
    * ``deep-chain``: a 3,000-page chain over 4 hosts (BFS depth ~2,250);
    * ``skewed-polite``: a 20,000-page host and 200 hosts of 20 pages (small hosts scale in
      number, not size), all capped at 2 requests/s.
    """
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")

    def scaled(n: int, least: int) -> int:
        return max(least, round(n * scale))

    if name == "few-large":
        return bench_spec(port, scaled(10_000, 2), 2, page_bytes)
    if name == "mixed-50":
        return MixedSite("mixed-50", _loopback_hosts(50), port, [scaled(400, 20)] * 50, page_bytes)
    if name == "deep-chain":
        return ChainSite(_loopback_hosts(4), port, scaled(3_000, 40), page_bytes)
    if name == "skewed-polite":
        hosts = _loopback_hosts(1 + scaled(200, 2))
        return SkewedSite(hosts, port, scaled(20_000, 40), 20, page_bytes, cap=2.0)
    raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")


# -- the server ------------------------------------------------------------------------------------


def with_crawl_delay(robots: str, delay: float) -> str:
    """``robots`` with ``Crawl-delay: delay`` added to every user-agent group."""
    out: list[str] = []
    lines = robots.splitlines()
    for k, line in enumerate(lines):
        out.append(line)
        is_ua = line.strip().lower().startswith("user-agent:")
        next_is_ua = k + 1 < len(lines) and lines[k + 1].strip().lower().startswith("user-agent:")
        if is_ua and not next_is_ua:
            out.append(f"Crawl-delay: {delay:g}")
    return "\n".join(out) + "\n"


class DemoSite:
    """Serves a :class:`SiteSpec` on every ``host:port`` from a background thread.

    The server has its own event loop so it works under sync tests, async tests and the
    benchmark alike, and it records every request so tests can check politeness (robots obeyed,
    no URL fetched twice, per-host rates) from the server's side, where it cannot be faked.
    """

    def __init__(
        self,
        spec: SiteSpec,
        *,
        crawl_delay: float | None = None,
        rate_limit_log: bool = False,
        rate_cap: float | Mapping[str, float] | None = None,
        rate_enforce: bool = True,
        rate_slack_s: float = RATE_SLACK_S,
    ) -> None:
        """``rate_cap`` (requests/s, for every host or per host) makes the site police its
        visitors: a request that is more than the cap within the past ``1 - rate_slack_s``
        seconds (itself and every earlier request to the host counted, robots.txt and refused
        ones too) is a violation, and with ``rate_enforce`` it is answered 429 (Retry-After:
        1) instead of served. The slack absorbs arrival jitter, so a crawler that spaces its
        requests exactly ``1 / cap`` apart never trips it.
        """
        if not 0 <= rate_slack_s < 1:
            raise ValueError(f"rate_slack_s must be in [0, 1), got {rate_slack_s}")
        self.spec = spec
        self.crawl_delay = crawl_delay
        self.rate_limit_log = rate_limit_log
        caps = (
            dict.fromkeys(spec.hosts, float(rate_cap))
            if isinstance(rate_cap, int | float)
            else dict(rate_cap or {})
        )
        if any(c <= 0 for c in caps.values()):
            raise ValueError(f"rate caps must be > 0, got {caps}")
        #: host -> requests/s the site allows it (hosts not listed are uncapped)
        self.rate_caps: dict[str, float] = caps
        self.rate_enforce = rate_enforce
        self.rate_slack_s = rate_slack_s
        #: "http://host:port/path?query" as requested (query order kept) -> count
        self.requests: collections.Counter[str] = collections.Counter()
        #: (time.monotonic(), host, path?query) per request, in arrival order
        self.request_log: list[tuple[float, str, str]] = []
        #: the status answered to each request of ``request_log``, same order
        self.statuses: list[int] = []
        #: host -> requests over its rate cap (see ``rate_cap``)
        self.rate_violations: collections.Counter[str] = collections.Counter()
        #: host -> requests answered 429
        self.rate_limited: collections.Counter[str] = collections.Counter()
        # host -> arrival times within the cap's window; touched by the server thread only
        self._windows: dict[str, deque[float]] = {h: deque() for h in caps}
        self._transient: collections.Counter[str] = collections.Counter()
        # Guards requests/request_log so a test thread can snapshot them mid-crawl.
        self._lock = threading.Lock()
        self._robots: dict[str, bytes | None] = {}
        for h in spec.hosts:
            r = spec.robots_txt(h)
            if r is not None and crawl_delay is not None:
                r = with_crawl_delay(r, crawl_delay)
            self._robots[h] = None if r is None else r.encode()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.ServerRunner] = []
        self._rate_task: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind every host:port and return once all are listening (raises if one cannot)."""
        if self._thread is not None:
            raise RuntimeError("DemoSite already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:
                failure.append(exc)
                loop.run_until_complete(self._close())
                loop.close()
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="demo-site", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            self._loop = None
            raise failure[0]

    def stop(self) -> None:
        """Close all listeners and connections and end the server thread. Idempotent."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None
        self._loop = None

    def __enter__(self) -> DemoSite:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def _listen(self) -> None:
        for host in self.spec.hosts:
            server = web.Server(self._handler_for(host), access_log=None)
            runner = web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            self._runners.append(runner)
            await web.TCPSite(runner, host, self.spec.port, backlog=1024).start()
        if self.rate_limit_log:
            self._rate_task = asyncio.get_running_loop().create_task(self._log_rates())

    async def _close(self) -> None:
        if self._rate_task is not None:
            self._rate_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rate_task
            self._rate_task = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    # -- serving -------------------------------------------------------------------------------

    def _handler_for(
        self, host: str
    ) -> collections.abc.Callable[[web.BaseRequest], collections.abc.Awaitable[web.Response]]:
        prefix = f"http://{host}:{self.spec.port}"
        requests = self.requests
        request_log = self.request_log
        statuses = self.statuses
        lock = self._lock
        window = self._windows.get(host)
        cap = self.rate_caps.get(host, 0.0)
        span = 1.0 - self.rate_slack_s
        enforce = self.rate_enforce
        respond = self._responder(host)

        async def handle(request: web.BaseRequest) -> web.Response:
            # No await from arrival to the log entry: entries keep arrival order, and each
            # request's status lands beside it.
            raw = request.raw_path
            now = time.monotonic()
            over = False
            if window is not None:
                while window and window[0] <= now - span:
                    window.popleft()
                window.append(now)
                over = len(window) > cap
            if over and enforce:
                response = web.Response(
                    status=429,
                    body=b"<html><head><title>Slow down</title></head><body>429</body></html>",
                    headers={"Content-Type": _HTML, "Retry-After": "1"},
                )
            else:
                response = respond(raw)
            with lock:
                requests[prefix + raw] += 1
                request_log.append((now, host, raw))
                statuses.append(response.status)
                if over:
                    self.rate_violations[host] += 1
                if response.status == 429:
                    self.rate_limited[host] += 1
            return response

        return handle

    def _responder(self, host: str) -> collections.abc.Callable[[str], web.Response]:
        """What ``host`` answers to a request for ``raw`` (path?query), rate caps aside."""
        prefix = f"http://{host}:{self.spec.port}"
        spec = self.spec
        robots = self._robots[host]

        def respond(raw: str) -> web.Response:
            if raw.partition("?")[0] == "/robots.txt":
                if robots is None:
                    return web.Response(
                        status=404, body=b"no robots.txt here\n", headers={"Content-Type": _TEXT}
                    )
                return web.Response(body=robots, headers={"Content-Type": _TEXT})
            page = spec.page(host, raw)
            if page is None:
                return _not_found(raw)
            if page.transient_503s:
                key = prefix + page.path
                if self._transient[key] < page.transient_503s:
                    self._transient[key] += 1
                    headers = {"Content-Type": _HTML}
                    if spec.transient_retry_after is not None:
                        headers["Retry-After"] = spec.transient_retry_after
                    return web.Response(
                        status=503,
                        body=b"<html><head><title>Busy</title></head><body>try later</body></html>",
                        headers=headers,
                    )
            return web.Response(
                status=page.status, body=spec.body(page), headers={"Content-Type": _HTML}
            )

        return respond

    async def _log_rates(self) -> None:
        """Once a second, log each host's request count over the past second."""
        seen = 0
        while True:
            await asyncio.sleep(1.0)
            with self._lock:
                fresh = self.request_log[seen:]
            seen += len(fresh)
            per_host = collections.Counter(h for _, h, _ in fresh)
            for h in self.spec.hosts:
                if per_host[h]:
                    log.info("demo-site %s: %d req/s", h, per_host[h])

    # -- inspection ----------------------------------------------------------------------------

    def snapshot(self) -> tuple[collections.Counter[str], list[tuple[float, str, str]]]:
        """Consistent copies of ``requests`` and ``request_log``, safe while a crawl runs."""
        with self._lock:
            return collections.Counter(self.requests), list(self.request_log)

    def hits(self, host: str | None = None) -> int:
        """Requests received in total, or by ``host`` (robots.txt included)."""
        if host is None:
            return len(self.request_log)
        return sum(1 for _, h, _ in self.snapshot()[1] if h == host)

    def max_rate(self, host: str, window: float = 1.0) -> int:
        """Most requests ``host`` received within any ``window`` seconds: for politeness checks."""
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        times = [t for t, h, _ in self.snapshot()[1] if h == host]
        best, lo = 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] >= window:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    def log_with_statuses(self, start: int = 0) -> list[tuple[float, str, str, int]]:
        """``(time, host, path?query, status answered)`` per request from the ``start``-th on.

        Safe while a crawl runs; a watcher passes the count it has already seen.
        """
        with self._lock:
            return [
                (t, h, raw, status)
                for (t, h, raw), status in zip(
                    self.request_log[start:], self.statuses[start:], strict=True
                )
            ]

    def violations(self, host: str | None = None) -> int:
        """Requests over their host's rate cap, in total or for ``host``."""
        with self._lock:
            if host is None:
                return sum(self.rate_violations.values())
            return self.rate_violations[host]

    def reset(self) -> None:
        """Forget all requests, rate and transient-failure state, as a fresh server would."""
        with self._lock:
            self.requests.clear()
            self.request_log.clear()
            self.statuses.clear()
            self.rate_violations.clear()
            self.rate_limited.clear()
        if self._loop is not None and self._windows:
            # the windows belong to the server thread
            done = threading.Event()

            def clear() -> None:
                for w in self._windows.values():
                    w.clear()
                done.set()

            self._loop.call_soon_threadsafe(clear)
            done.wait(5)
        else:
            for w in self._windows.values():
                w.clear()
        self._transient.clear()


def _not_found(path: str) -> web.Response:
    body = (
        "<html><head><title>Not found</title></head>"
        f"<body>{html.escape(path)} is not here</body></html>"
    )
    return web.Response(status=404, body=body.encode(), headers={"Content-Type": _HTML})


def free_port(
    hosts: Iterable[str] = ("127.0.0.2", "127.0.0.3", "127.0.0.4"), start: int = 18080
) -> int:
    """First port >= ``start`` that every host can bind now, so parallel test runs don't clash.

    A fixed starting point keeps ports predictable in logs; probing avoids a hard-coded port
    that another process already holds.
    """
    hosts = tuple(hosts)
    for port in range(start, min(start + 2000, 65536)):
        socks: list[socket.socket] = []
        try:
            for h in hosts:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((h, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no free port in {start}..{start + 2000} on {hosts}")


def serve_forever(spec: SiteSpec, rate_cap: float | None = None) -> None:
    """Serve ``spec`` until SIGINT or SIGTERM: for demos and manual crawls."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with DemoSite(spec, rate_limit_log=True, rate_cap=rate_cap):
            lines = [
                f"demo site listening on {len(spec.hosts)} hosts, port {spec.port}; seeds:",
                *(f"  {s}" for s in spec.seeds()),
                f"{len(spec.expected())} URLs expected from a full crawl; Ctrl-C to stop",
            ]
            print("\n".join(lines), flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--bench", action="store_true", help="serve the generated bench site")
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=8, help="host count for --bench")
    parser.add_argument("--shape", choices=SHAPES, help="serve a benchmark shape instead")
    parser.add_argument("--scale", type=float, default=1.0, help="page-count scale for --shape")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.shape:
        spec = shape_spec(args.shape, args.port, args.scale)
        serve_forever(spec, rate_cap=spec.cap if isinstance(spec, SkewedSite) else None)
        return
    spec = bench_spec(args.port, args.pages, args.hosts) if args.bench else demo_spec(args.port)
    serve_forever(spec)


if __name__ == "__main__":
    main()
