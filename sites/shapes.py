"""The benchmark's site shapes (:data:`SHAPES`, :func:`shape_spec`): few large hosts, many
failing hosts, a deep chain, one huge host beside many small capped ones.

One site shape says little about a crawler; ``bench.shapes_bench`` crawls each of these.
Every page is a pure function of its host's index and its number, so the shapes are
deterministic and cost no memory per page.
"""

from __future__ import annotations

from collections.abc import Iterable

from sites.bench_site import bench_spec
from sites.rendering import filler_variants, mix64, prose, render_page
from sites.site_spec import Page, SiteSpec

__all__ = ["SHAPES", "ChainSite", "MixedSite", "ShapeSite", "SkewedSite", "shape_spec"]


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
        self._filler = filler_variants(max(0, page_bytes - 1_500), self._FILLER_VARIANTS)

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
        return mix64((h << 40) ^ (k << 8) ^ purpose)

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
            return render_page(page.title, (), [f"{page.path} is not here."]).encode()
        salt = self._rand(h, k, 0)
        intro = prose(1, 30, salt % 1_000_003)
        return render_page(
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
            x = mix64(x)
            targets.append(x % n)
        hrefs = [self.path(t) for t in targets]
        others = len(self.hosts) - 1
        for _ in range(1 + (r >> 8) % 2 if others else 0):
            x = mix64(x)
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
                x = mix64(x)
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
