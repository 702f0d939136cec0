"""A local multi-host website for crawler tests, demos and benchmarks.

Linux routes all of 127.0.0.0/8 to ``lo``, so every "host" of the site is a distinct loopback
IP bound on the same port: each is a separate crawl target with its own robots.txt and its own
politeness budget, yet nothing ever leaves the machine.

The content (:class:`SiteSpec`) is pure data, so tests can compute the exact set of URLs a
correct crawler must store (:meth:`SiteSpec.expected`) without running a server; the server
(:class:`DemoSite`) only serves that data and counts what it was asked for.

Run ``python -m infra.demo_site --port 18080`` to serve the small demo site until Ctrl-C.
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
    "USER_AGENT",
    "DemoSite",
    "Page",
    "SiteSpec",
    "bench_spec",
    "canonical_url",
    "demo_spec",
    "free_port",
    "serve_forever",
    "with_crawl_delay",
]

log = logging.getLogger(__name__)

#: the robots.txt user-agent token the crawler identifies itself with
USER_AGENT = "crawlfleet"

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
        self._filler: list[str] = []
        target = max(0, page_bytes - 600 - 60 * links_per_page)
        for v in range(self._FILLER_VARIANTS):
            paras, size = [], 0
            for p in _paragraphs(max(1, target // 300 + 1), 40, v):
                if size >= target:
                    break
                paras.append(f"<p>{p}</p>\n")
                size += len(paras[-1])
            self._filler.append("".join(paras))

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
        self, spec: SiteSpec, *, crawl_delay: float | None = None, rate_limit_log: bool = False
    ) -> None:
        self.spec = spec
        self.crawl_delay = crawl_delay
        self.rate_limit_log = rate_limit_log
        #: "http://host:port/path?query" as requested (query order kept) -> count
        self.requests: collections.Counter[str] = collections.Counter()
        #: (time.monotonic(), host, path?query) per request, in arrival order
        self.request_log: list[tuple[float, str, str]] = []
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
        spec = self.spec
        requests = self.requests
        request_log = self.request_log
        robots = self._robots[host]
        lock = self._lock

        async def handle(request: web.BaseRequest) -> web.Response:
            raw = request.raw_path
            with lock:
                requests[prefix + raw] += 1
                request_log.append((time.monotonic(), host, raw))
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
                    return web.Response(
                        status=503,
                        body=b"<html><head><title>Busy</title></head><body>try later</body></html>",
                        headers={"Content-Type": _HTML, "Retry-After": "1"},
                    )
            return web.Response(
                status=page.status, body=spec.body(page), headers={"Content-Type": _HTML}
            )

        return handle

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

    def reset(self) -> None:
        """Forget all requests and transient-failure state, as a fresh server would."""
        with self._lock:
            self.requests.clear()
            self.request_log.clear()
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


def serve_forever(spec: SiteSpec) -> None:
    """Serve ``spec`` until SIGINT or SIGTERM: for demos and manual crawls."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with DemoSite(spec, rate_limit_log=True):
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    spec = bench_spec(args.port, args.pages, args.hosts) if args.bench else demo_spec(args.port)
    serve_forever(spec)


if __name__ == "__main__":
    main()
