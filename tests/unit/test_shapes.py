"""The benchmark's site shapes are what the shapes benchmark says they are (no server here).

``bench.shapes_bench`` referees every crawl with ``expected()``, so each shape's expected set,
failure fractions and structure are pinned down from the spec alone; the running server is
checked in ``test_demo_site.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from sites.shapes import SHAPES, ChainSite, MixedSite, ShapeSite, SkewedSite, shape_spec

PORT = 18700


def _host(url: str) -> str:
    return url.split("/")[2].split(":")[0]


def test_every_shape_at_full_size_has_its_documented_size() -> None:
    sizes = {}
    for name in SHAPES:
        spec = shape_spec(name, PORT)
        sizes[name] = (len(spec.hosts), len(spec.expected()))
    assert sizes == {
        "few-large": (2, 10_000),
        "mixed-50": (50, 20_000),
        "deep-chain": (4, 3_000),
        "skewed-polite": (201, 20_000 + 200 * 20),
    }
    skewed = shape_spec("skewed-polite", PORT)
    assert skewed.hosts[0] == "127.0.0.2"
    assert skewed.hosts[-1] == "127.0.0.202"


def test_scale_shrinks_pages_and_unknown_shapes_are_refused() -> None:
    assert len(shape_spec("few-large", PORT, scale=0.1).expected()) == 1_000
    mixed = shape_spec("mixed-50", PORT, scale=0.1)
    assert len(mixed.hosts) == 50
    assert len(mixed.expected()) == 50 * 40
    skewed = shape_spec("skewed-polite", PORT, scale=0.1)
    assert isinstance(skewed, SkewedSite)
    assert skewed.pages_per_host[0] == 2_000
    assert len(skewed.small_hosts) == 20
    assert set(skewed.pages_per_host[1:]) == {20}  # small hosts keep their size (and bound)
    with pytest.raises(ValueError, match="unknown shape"):
        shape_spec("nope", PORT)
    with pytest.raises(ValueError, match="scale"):
        shape_spec("mixed-50", PORT, scale=0)


def test_shapes_are_deterministic() -> None:
    for name in SHAPES:
        a, b = shape_spec(name, PORT, 0.05), shape_spec(name, PORT, 0.05)
        assert a.expected() == b.expected()
        host = a.hosts[-1]
        pa, pb = a.page(host, "/p/3.html"), b.page(host, "/p/3.html")
        assert pa == pb
        assert pa is not None
        assert a.body(pa) == b.body(pa)


def test_mixed_has_its_failures_and_link_mix() -> None:
    spec = shape_spec("mixed-50", PORT)
    assert isinstance(spec, MixedSite)
    pages = spec.all_pages()
    exp = spec.expected()
    # every page is reachable (past any 404) and expected with its status; nothing private
    assert set(exp) == {spec.url(p.host, p.path) for p in pages}
    assert all(exp[spec.url(p.host, p.path)] == p.status for p in pages)
    assert not any("/private/" in u for u in exp)
    n = len(pages)
    not_found = [p for p in pages if p.status == 404]
    assert 0.025 <= len(not_found) / n <= 0.035
    assert all(not p.links for p in not_found)  # error pages have nothing to follow
    flaky = [p for p in pages if p.transient_503s]
    assert 0.025 <= len(flaky) / n <= 0.035
    assert {p.transient_503s for p in flaky} == {1}
    assert all(p.status == 200 for p in flaky)
    private = [p for p in pages if any("/private/" in ln for ln in p.links)]
    assert 0.22 <= len(private) / n <= 0.28
    for p in pages:
        if p.status != 200:
            continue
        links = [ln for ln in p.links if "/private/" not in ln]
        same = sum(1 for ln in links if _host(ln) == p.host)
        assert 10 <= same <= 20
        assert 1 <= len(links) - same <= 2
    body = spec.body(pages[2])
    assert 10_000 <= len(body) <= 14_000
    # the private pages exist: robots.txt is advice, the referee counts who ignores it
    assert spec.page("127.0.0.2", "/private/4.html") is not None
    assert spec.page("127.0.0.2", "/p/400.html") is None
    assert spec.page("127.0.0.2", "/p/0.html") is None  # the home page is spelled "/"


def test_deep_chain_is_deep_and_narrow() -> None:
    spec = shape_spec("deep-chain", PORT)
    assert isinstance(spec, ChainSite)
    full = spec.expected()
    assert len(full) == 3_000
    assert set(full.values()) == {200}
    assert len(spec.expected(max_depth=1_900)) < 3_000  # depth in the thousands
    assert len(spec.expected(max_depth=2_100)) == 3_000
    # each BFS level holds one or two new pages: little to do in parallel
    d100, d101 = spec.expected(max_depth=100), spec.expected(max_depth=101)
    assert 1 <= len(d101) - len(d100) <= 2
    assert all(len(p.links) <= 3 for p in spec.all_pages())
    # consecutive chain pages sit on different hosts
    assert _host(spec.chain_url(7)) != _host(spec.chain_url(8))


def test_skewed_seeds_the_big_host_first_and_small_hosts_need_their_seeds() -> None:
    spec = shape_spec("skewed-polite", PORT, scale=0.1)
    assert isinstance(spec, SkewedSite)
    assert spec.cap == 2.0
    seeds = spec.seeds()
    big = spec.pages_per_host[0]
    assert len(seeds) == big + len(spec.small_hosts)
    assert seeds[0] == spec.url(spec.big_host, "/")
    assert all(_host(s) == spec.big_host for s in seeds[:big])
    assert seeds[big:] == [spec.url(h, "/") for h in spec.small_hosts]
    exp = spec.expected()
    per_host = Counter(_host(u) for u in exp)
    assert per_host[spec.big_host] == big
    assert {per_host[h] for h in spec.small_hosts} == {20}
    assert not any("/private/" in u for u in exp)
    # a small host's home links to all of its pages (one hop) and into /private/
    home = spec.page(spec.small_hosts[0], "/")
    assert home is not None
    assert len(home.links) == 20
    assert any("/private/" in ln for ln in home.links)
    # without their seeds the small hosts are unreachable: nothing links to them
    only_big = spec.with_seeds(seeds[:big]).expected()
    assert {_host(u) for u in only_big} == {spec.big_host}


def test_shape_lookups_accept_only_canonical_page_numbers() -> None:
    spec = shape_spec("mixed-50", PORT, scale=0.05)
    assert isinstance(spec, ShapeSite)
    assert spec.page("127.0.0.2", "/p/5.html") is not None
    assert spec.page("127.0.0.2", "/p/05.html") is None
    assert spec.page("127.0.0.2", "/p/x.html") is None
    assert spec.page("127.0.0.99", "/") is None
    assert spec.page("127.0.0.2", "/p/5.html#frag") == spec.page("127.0.0.2", "/p/5.html")


def test_shapes_bench_referee_counts_deferrals_refetches_and_disallowed() -> None:
    from bench.shapes_referee import referee

    spec = shape_spec("mixed-50", PORT, scale=0.05)
    exp = spec.expected()
    log = []
    for t, url in enumerate(exp):
        host = _host(url)
        log.append((float(t), host, url[len(spec.url(host, "")) :], exp[url]))
    assert referee(spec, exp, log).exact
    h = spec.hosts[0]
    bad = [
        *log,
        (1e6, h, "/robots.txt", 200),
        (1e6, h, "/", 503),  # a deferral: asked again later, not a refetch
        (1e6, h, "/", 429),
        (1e6, h, "/?", 200),  # the home page again, spelled otherwise
        (1e6, h, "/private/3.html", 200),
    ]
    ref = referee(spec, exp, bad)
    assert (ref.served, ref.expected) == (len(exp), len(exp))
    assert (ref.deferred, ref.refetched, ref.unexpected, ref.disallowed) == (2, 1, 1, 1)
    assert ref.robots == 1
    assert not ref.exact
    assert referee(spec, exp, log[1:]).served == len(exp) - 1
