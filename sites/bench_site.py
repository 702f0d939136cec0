"""The generated throughput benchmark site (:func:`bench_spec`): many equal pages, many hosts.

Pages are generated on demand from their number (no per-page storage), so the site can hold
tens of thousands of pages while serving stays far cheaper than crawling.
"""

from __future__ import annotations

from sites.rendering import filler_variants, mix64, prose, render_page
from sites.site_spec import Page, SiteSpec

__all__ = ["bench_spec"]


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
        self._filler = filler_variants(
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
        targets += [mix64(i * 131 + k) % self.n for k in range(1, self.links_per_page)]
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
        intro = prose(1, 30, salt + 1_000_003)
        filler = self._filler[salt % self._FILLER_VARIANTS]
        return render_page(page.title, page.hrefs, intro, filler).encode()


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
