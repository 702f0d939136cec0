"""What a local test site is, as pure data: its pages and the crawl a correct crawler makes.

Linux routes all of 127.0.0.0/8 to ``lo``, so every "host" of a site is a distinct loopback
IP bound on the same port: each is a separate crawl target with its own robots.txt and its own
politeness budget, yet nothing ever leaves the machine.

A :class:`SiteSpec` holds no I/O, so tests can compute the exact set of URLs a correct crawler
must store (:meth:`SiteSpec.expected`) without running a server; the concrete sites live in
``sites.demo_pages``, ``sites.bench_site`` and ``sites.shapes``, the server in
``sites.demo_server``.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Self
from urllib.parse import urlsplit

from protego import Protego
from w3lib.url import canonicalize_url

__all__ = ["USER_AGENT", "Page", "SiteSpec", "canonical_url"]

#: the robots.txt user-agent token the crawler identifies itself with
USER_AGENT = "crawlfleet"


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
