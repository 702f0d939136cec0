"""The small demo site (:func:`demo_spec`): ~20 hand-written pages per host.

It is what ``crawlfleet demo`` crawls and what most tests use: every case a polite crawler
must handle (robots.txt groups, 404s, a flaky page, query orders, fragments, non-HTTP links,
cross-host links) on a few pages whose expected crawl is easy to reason about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sites.rendering import prose, render_page, resolve_hrefs
from sites.site_spec import USER_AGENT, Page, SiteSpec

__all__ = ["demo_spec"]


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
            paras = [text, *prose(2, 24, i)]
            self._bodies[key] = render_page(p.title, p.hrefs or p.links, paras).encode()

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
                links=resolve_hrefs(_base + path, hrefs),
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
