"""Sitemap expansion (issue 45, part 4): a fetched sitemap → the jobs it lists, pure.

Indexes, gzip files, text sitemaps and ``lastmod``; the caps (a decompression bomb, an
index nested past the depth cap, URLs per target); the rules every listed URL passes (an
off-scope and a private-address URL); a malformed sitemap dead-lettered with its reason.
"""

from __future__ import annotations

import gzip
from typing import Any

import pytest

from consumers.fetch.http import Response
from consumers.fetch.sitemap_fetch import PACK_OVER, packed, robots_outputs
from consumers.sitemaps import (
    SitemapStep,
    UrlRules,
    expand,
    fetch_cap,
    inflate,
    parse_listing,
    robots_sitemaps,
    sitemap_depth,
)
from core.config import Settings, load_settings
from core.errors import ConfigError, SitemapError, SitemapTooLargeError
from infra.topics import topology_of
from producers.frontier import parse_line
from schemas.keys import SITEMAP_DEPTH, listed_lastmod
from schemas.records import CrawlJob, FetchResult
from streams.io import Encoder, Output

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
SM = "http://a.test/sitemap.xml"


def _settings(**kw: Any) -> Settings:
    return load_settings(topic_prefix="u.", partitions=4, **kw)


def _job(url: str = SM, depth: int = 0, **kw: Any) -> CrawlJob:
    job: dict[str, Any] = {
        "url": url, "target": "a.test", "profile": "default", "depth": 0, "attempt": 0,
        "parent_url": None, "last_error": None, "priority": 0,
        "meta": {SITEMAP_DEPTH: str(depth)} if depth else {}, "delay_ms": 0,
        "pinned": True, "kind": "sitemap", "visit": 0, "validators": {}, **kw}
    return job  # type: ignore[return-value]


def urlset(*entries: tuple[str, str | None]) -> bytes:
    body = "".join(f"<url><loc>{u}</loc>{f'<lastmod>{m}</lastmod>' if m else ''}</url>"
                   for u, m in entries)
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset {NS}>{body}</urlset>'.encode()


def index(*urls: str) -> bytes:
    body = "".join(f"<sitemap><loc>{u}</loc></sitemap>" for u in urls)
    return f'<?xml version="1.0"?><sitemapindex {NS}>{body}</sitemapindex>'.encode()


def _expand(body: bytes, job: CrawlJob | None = None, **kw: Any) -> Any:
    s = _settings(**kw)
    return expand(job or _job(), body, s, UrlRules.of(s))


def test_an_urlset_lists_pages_with_their_lastmod() -> None:
    out = _expand(urlset(("http://a.test/p1", "2026-11-01T10:00:00+02:00"),
                         ("HTTP://A.test:80/p2#frag", "2026-11-02"), ("http://a.test/p3", None)))
    assert [j["url"] for j in out.jobs] == ["http://a.test/p1", "http://a.test/p2",
                                            "http://a.test/p3"]
    assert [listed_lastmod(j) for j in out.jobs] == [
        "2026-11-01T08:00:00+00:00", "2026-11-02T00:00:00+00:00", None]
    page = out.jobs[0]
    assert page["kind"] == "page" and page["parent_url"] == SM and page["depth"] == 0
    assert page["meta"] == {} and page["visit"] == 0


def test_an_index_lists_sitemaps_one_level_deeper_and_fetches_nothing() -> None:
    out = _expand(index("http://a.test/s1.xml", "http://a.test/s2.xml.gz"), _job(depth=3))
    assert [(j["url"], j["kind"], sitemap_depth(j)) for j in out.jobs] == [
        ("http://a.test/s1.xml", "sitemap", 4), ("http://a.test/s2.xml.gz", "sitemap", 4)]
    assert not out.too_deep


def test_an_index_nested_past_the_depth_cap_is_a_dead_letter() -> None:
    out = _expand(index("http://a.test/deeper.xml"), _job(depth=2), sitemap_max_depth=2)
    assert out.jobs == [] and [j["url"] for j in out.too_deep] == ["http://a.test/deeper.xml"]
    assert _expand(index("http://a.test/d.xml"), sitemap_max_depth=0).too_deep


def test_a_gzip_file_is_inflated() -> None:
    out = _expand(gzip.compress(urlset(("http://a.test/z", "2026-01-01"))))
    assert [j["url"] for j in out.jobs] == ["http://a.test/z"]


def test_an_rss_feed_lists_its_items() -> None:
    rss = (b'<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>'
           b"<item><title>x</title><link>http://a.test/news/1</link>"
           b"<pubDate>Mon, 02 Nov 2026 10:00:00 GMT</pubDate></item></channel></rss>")
    out = _expand(rss)
    assert [(j["url"], listed_lastmod(j)) for j in out.jobs] == [
        ("http://a.test/news/1", "2026-11-02T10:00:00+00:00")]


def test_a_byte_order_mark_is_no_text_sitemap() -> None:
    out = _expand(b"\xef\xbb\xbf" + urlset(("http://a.test/bom", None)))
    assert [j["url"] for j in out.jobs] == ["http://a.test/bom"]


def test_a_text_sitemap_lists_one_url_a_line() -> None:
    out = _expand(b"http://a.test/t1\n\n  http://a.test/t2  \nnot a url\n")
    assert [j["url"] for j in out.jobs] == ["http://a.test/t1", "http://a.test/t2"]


def test_a_decompression_bomb_stops_at_the_cap() -> None:
    bomb = gzip.compress(b"<" + b" " * (64 * 1024 * 1024))  # 64 MiB of blanks, ~64 KB
    assert len(bomb) < 200_000
    with pytest.raises(SitemapTooLargeError) as caught:
        inflate(bomb, 1024 * 1024)
    assert caught.value.reason == "sitemap_too_large"
    with pytest.raises(SitemapTooLargeError):
        inflate(b"x" * 2048, 1024)  # a plain body past the cap too


def test_listed_urls_pass_scope_target_and_address_rules() -> None:
    out = _expand(urlset(("http://a.test/ok", None), ("http://elsewhere.test/x", None),
                         ("http://10.0.0.5/internal", None), ("http://localhost/x", None),
                         ("ftp://a.test/f", None), ("http://a.test/ok", None)), scope="any")
    assert [j["url"] for j in out.jobs] == ["http://a.test/ok", "http://elsewhere.test/x"]
    assert out.dropped == {"address": 2, "invalid": 1}  # usp itself drops the repeat
    same = _expand(urlset(("http://a.test/ok", None), ("http://elsewhere.test/x", None)))
    assert [j["url"] for j in same.jobs] == ["http://a.test/ok"]
    assert same.dropped == {"off_scope": 1}
    allowed = _expand(urlset(("http://10.0.0.5/x", None)), allow_hosts="10.0.0.0/8",
                      scope="any")
    assert [j["url"] for j in allowed.jobs] == ["http://10.0.0.5/x"]


def test_urls_per_target_are_capped_and_entries_bound_the_parse() -> None:
    body = urlset(*((f"http://a.test/{i}", None) for i in range(5)))
    out = _expand(body, sitemap_max_urls=3)
    assert len(out.jobs) == 3 and out.dropped == {"over_cap": 2}
    big = urlset(*((f"http://a.test/{i}", None) for i in range(7)))
    with pytest.raises(SitemapTooLargeError, match="more than 6 entries"):
        _expand(big, sitemap_max_urls=3)


@pytest.mark.parametrize("body", [
    b"<html><body>not a sitemap</body></html>",
    urlset(("http://a.test/1", None))[:-12],  # cut short: usp would salvage half
    b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e "boom">]><urlset>&e;</urlset>',
    b"just some words\nand more\n",
    b"\x1f\x8b\x08\x00broken gzip",
])
def test_a_malformed_sitemap_raises_its_reason(body: bytes) -> None:
    with pytest.raises(SitemapError) as caught:
        _expand(body)
    assert caught.value.reason == "sitemap_malformed"


def test_an_empty_urlset_lists_nothing() -> None:
    assert parse_listing(urlset().decode(), 10).pages == []


def _step(**kw: Any) -> tuple[SitemapStep, dict[str, int]]:
    s = _settings(**kw)
    topo = topology_of(s)
    counts: dict[str, int] = {}

    def count(name: str, n: int) -> None:
        counts[name] = counts.get(name, 0) + n
    return SitemapStep(s, Encoder(topo, "w1"), topo, count), counts


def _result(body: bytes, status: int = 200, job: CrawlJob | None = None) -> FetchResult:
    return {"job": job or _job(), "final_url": SM, "status": status,  # type: ignore[typeddict-item]
            "content_type": "application/xml", "body": body, "fetched_at_ms": 1,
            "elapsed_ms": 1, "redirects": [], "worker": "f1"}


def _decoded(step: SitemapStep, out: Output) -> dict[str, Any]:
    assert out.value is not None
    value = step.enc.codec.decode(step.topology.record_of(out.topic), out.value, out.headers)
    assert isinstance(value, dict)
    return value


def test_the_parse_step_publishes_jobs_with_lineage_and_dead_letters_the_rest() -> None:
    step, counts = _step(sitemap_max_depth=0)
    topo = step.topology
    outs = step.outputs(_result(urlset(("http://a.test/p", "2026-01-01"),
                                       ("http://10.1.1.1/p", None))), None)
    assert [o.topic for o in outs] == [topo.frontier, topo.lineage]
    assert _decoded(step, outs[0])["validators"] == {"lastmod": "2026-01-01T00:00:00+00:00"}
    assert counts == {"sitemaps": 1, "sitemap_jobs": 1, "sitemap_address": 1}
    deep = step.outputs(_result(index("http://a.test/s2.xml")), None)
    assert [o.topic for o in deep] == [topo.dead]
    assert _decoded(step, deep[0])["reason"] == "sitemap_too_deep"
    bad = step.outputs(_result(b"<html></html>"), None)
    letter = _decoded(step, bad[0])
    assert [o.topic for o in bad] == [topo.dead] and letter["reason"] == "sitemap_malformed"
    assert letter["job"]["url"] == SM
    assert step.outputs(_result(b"gone", status=404), None) == []


def test_robots_sitemap_lines_become_sitemap_jobs_for_a_profile_that_follows_them() -> None:
    s = _settings(follow_sitemaps=True)
    page = {**_job("http://a.test/page"), "kind": "page"}
    jobs = robots_sitemaps(page, "http://a.test/robots.txt",  # type: ignore[arg-type]
                           ["/sitemap.xml", "http://other.test/s.xml", "http://a.test/sitemap.xml",
                            "http://127.0.0.1/s.xml"], UrlRules.of(s), 10)
    assert [(j["url"], j["kind"], j["parent_url"], sitemap_depth(j)) for j in jobs] == [
        ("http://a.test/sitemap.xml", "sitemap", "http://a.test/robots.txt", 0)]
    topo = topology_of(s)
    enc = Encoder(topo, "w1")
    outs = robots_outputs(enc, topo, page, "", ("/sitemap.xml",), s)  # type: ignore[arg-type]
    assert [o.topic for o in outs] == [topo.frontier, topo.lineage]
    off = _settings()
    assert robots_outputs(Encoder(topology_of(off), "w1"), topology_of(off), page,  # type: ignore[arg-type]
                          "", ("/sitemap.xml",), off) == []


def test_the_fetch_side_caps_and_packs_a_sitemap_body() -> None:
    s = _settings(sitemap_max_bytes=4096)
    assert fetch_cap(_job(), s) == 4096 and fetch_cap({**_job(), "kind": "page"}, s) is None  # type: ignore[arg-type]
    big = urlset(*((f"http://a.test/{i}", None) for i in range(40_000)))
    assert len(big) > PACK_OVER
    resp = packed(_job(), Response(SM, 200, "application/xml", big, None, 1))
    assert resp.body[:2] == b"\x1f\x8b" and len(resp.body) < len(big) // 5
    assert inflate(resp.body, len(big)) == big
    small = Response(SM, 200, "application/xml", b"<urlset/>", None, 1)
    assert packed(_job(), small) is small


def test_settings_and_profiles_carry_the_sitemap_options() -> None:
    s = _settings()
    assert (s.sitemap_max_bytes, s.sitemap_max_depth, s.sitemap_max_urls) == \
        (50 * 1024 * 1024, 10, 50_000)
    assert not s.profile_table["default"].follow_sitemaps
    assert _settings(follow_sitemaps=True).profile_table["default"].follow_sitemaps
    for bad in ({"sitemap_max_bytes": 10}, {"sitemap_max_depth": -1},
                {"sitemap_max_urls": 0}):
        with pytest.raises(ConfigError):
            _settings(**bad)
    prof = {"p": {"user_agent": "bot/1 (+https://b.test)", "region": "local",
                  "follow_sitemaps": True}}
    assert _settings(profiles=prof, default_profile="p").profile_table["p"].follow_sitemaps
    with pytest.raises(ConfigError, match="follow_sitemaps"):
        _settings(profiles={"p": {**prof["p"], "follow_sitemaps": "yes"}}, default_profile="p")


def test_publish_makes_sitemap_jobs() -> None:
    job = parse_line("http://a.test/sitemap.xml", _settings(), kind="sitemap")
    assert job is not None and job["kind"] == "sitemap" and sitemap_depth(job) == 0


def test_a_transaction_takes_a_bounded_share_of_sitemap_jobs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from consumers import sitemaps
    from streams.batch_stage import NotDueError
    monkeypatch.setattr(sitemaps, "MAX_BATCH_JOBS", 2)
    step, _ = _step()
    body = urlset(*((f"http://a.test/{i}", None) for i in range(3)))
    assert len(step.outputs(_result(body), None)) == 6  # the first sitemap always goes
    with pytest.raises(NotDueError):
        step.outputs(_result(body), None)
    step.begin_batch()
    assert len(step.outputs(_result(body), None)) == 6
