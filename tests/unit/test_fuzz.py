"""Property tests (hypothesis) for the code that meets hostile input first.

Canonicalisation, target derivation, scope checks and link resolution take strings a site
wrote; the Avro codec takes bytes anyone could have produced. They must never raise
anything but the project's own error (``InvalidURLError``, ``DecodeError``), and the URL
functions must be idempotent, since dedupe keys and partitions are derived from them.

Settings come from the hypothesis profile (tests/conftest.py): in CI a fixed example count,
no deadline (the first call of w3lib or lexbor is slow) and ``derandomize=True``, so CI runs
the same examples every time; ``HYPOTHESIS_PROFILE=nightly`` explores new inputs. The store's
row building and the robots.txt rules are fuzzed too: a record that decodes must become a row
or a DecodeError (never an exception that stops the store), and any robots.txt answer must
give rules with a finite, non-negative interval.
"""

from __future__ import annotations

import string

from hypothesis import example, given, settings
from hypothesis import strategies as st

from consumers.html import extract
from consumers.scope import follow
from core import urls
from core.errors import DecodeError, InvalidURLError
from core.urls import canonicalize, host_of, origin_of, resolve_link, target_of
from schemas.codec import default_codec
from schemas.topics import HEADER_SCHEMA, Topology

#: The loaded profile's settings (tests/conftest.py): fixed examples in CI, new ones with
#: HYPOTHESIS_PROFILE=nightly.
FUZZ = settings()

# --- URL-ish strings ----------------------------------------------------------------------

# Mostly http(s), so most examples get past the scheme check and exercise the rest.
_SCHEMES = st.one_of(st.sampled_from(["http", "https", "HTTP", "hTtPs"]),
                     st.sampled_from(["http", "https"]),
                     st.sampled_from(["ftp", "javascript", "data", "mailto", "file", "ws", "",
                                      "h\u0000ttp", "http\t", " https", "http+unix"]))
_LABEL = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=0, max_size=12)
_IDN_LABEL = st.sampled_from(["bücher", "пример", "例え", "xn--bcher-kva", "xn--", "xn--zz",
                              "ÄÖÜ", "ß", "\u200d", "\ufb00", "\u210c", "a\u0301", "\U0001f600",
                              "xn--80ak6aa92e", "\u0130", "İstanbul", "\u3002"])
_IPV4 = st.ip_addresses(v=4).map(str)
_IPV6 = st.ip_addresses(v=6).map(lambda a: f"[{a}]")
_BAD_IP = st.sampled_from(["[::1", "::1]", "[1:2:3]", "[v1.fe]", "[::ffff:1.2.3.4]",
                           "[fe80::1%25eth0]", "[::1]]", "[]", "256.1.1.1", "0x7f.1",
                           "127.1", "1.2.3.4.5", "[64:ff9b::7f00:1]", "[2002:7f00:1::]"])
_HOST = st.one_of(
    st.lists(_LABEL.filter(bool), min_size=1, max_size=4).map(".".join),
    st.lists(st.one_of(_LABEL, _IDN_LABEL), min_size=1, max_size=5).map(".".join),
    _IPV4, _IPV6, _BAD_IP,
    st.text(max_size=20),
    st.just(""),
)
_PORT = st.one_of(st.just(""), st.integers(-5, 70000).map(lambda p: f":{p}"),
                  st.sampled_from([":", ":80", ":443", ":0080", ":+80", ": 80", ":8o",
                                   ":65535", ":65536", ":99999999999999999999"]))
_USERINFO = st.sampled_from(["", "user@", "user:pass@", "@", "a@b@", "%40@", ":@"])
_PCT = st.sampled_from(["%", "%2", "%zz", "%2F", "%2f", "%00", "%7E", "%e2%82%ac", "%C3",
                        "%25", "%20", "%3F", "%23", "%u2603"])
_SEGMENT_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/?#[] \t\n\r\\\x00\x7f"
_PATH_PART = st.one_of(st.text(alphabet=_SEGMENT_CHARS, max_size=20), _PCT,
                       st.sampled_from(["/./", "/../", "//", "..", ".", ";p=1", "?", "#",
                                        "?b=2&a=1", "?a=1&a=1", "?=", "?&&", "#frag"]),
                       st.text(max_size=8))
_PATH = st.lists(_PATH_PART, max_size=8).map("".join)
_WS = st.sampled_from(["", " ", "\t", "\n", "\r\n", "\x00", "\x0b", "\x0c", "\u00a0",
                       "\u2028", "\ufeff", "\x1f"])


@st.composite
def url_ish(draw: st.DrawFn) -> str:
    """Strings shaped like URLs, with every part free to be odd."""
    scheme = draw(_SCHEMES)
    sep = draw(st.one_of(st.just("://"), st.sampled_from([":/", ":", ":///", "//", "",
                                                          ":\\\\", "://\t"])))
    edge = st.one_of(st.just(""), _WS)
    url = (draw(edge) + scheme + sep + draw(st.one_of(st.just(""), _USERINFO)) + draw(_HOST)
           + draw(_PORT) + draw(_PATH) + draw(edge))
    if draw(st.integers(0, 20)) == 0:  # now and then very long
        url += "/" + draw(st.sampled_from(["a", "\u00e9", " ", "%41"])) * draw(
            st.integers(200, 5000))
    return url


@st.composite
def plausible_url(draw: st.DrawFn) -> str:
    """http(s) URLs most of which canonicalise, with odd hosts, ports and paths."""
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "Https"]))
    port = draw(st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}"),
                          st.sampled_from([":80", ":443"])))
    return f"{scheme}://{draw(_HOST)}{port}{draw(_PATH)}"


URLS = st.one_of(plausible_url(), url_ish(), st.text(max_size=300))
HREFS = st.one_of(
    url_ish(),
    _PATH,
    st.text(max_size=200),
    st.sampled_from(["", "#", "?", "//", "///", "//evil.example/x", "/", ".", "..", "../../x",
                     "javascript:alert(1)", " mailto:a@b", "data:text/html,x", "tel:1",
                     "HTTP://EXAMPLE.COM", "\\\\host\\path", "/\\evil.example",
                     "http:/path", "https:", "http://[::1", "http://%zz/", "?q=%",
                     "//[fe80::1%25eth0]/"]),
)


def _canonical(url: str) -> str | None:
    try:
        return canonicalize(url)
    except InvalidURLError:
        return None


def _assert_crawlable(url: str) -> None:
    assert url.startswith(("http://", "https://")), url
    assert canonicalize(url) == url, url
    assert host_of(url), url


# --- canonicalize -----------------------------------------------------------------------------


@FUZZ
@given(URLS)
@example("http://EXAMPLE.com:80/a/../b?z=1&a=2#x")
@example("http://[::FFFF:1.2.3.4]:8080/")
@example("https://bücher.example/%7Euser/")
@example("http://a.b/" + "x" * 5000)
@example("http://a.b/" + "\u00e9" * 2000)  # was canonical at 12,000 characters, once encoded
@example("http://\u00b9")  # nightly: IDNA maps it to "1", once an address, canonical twice
def test_canonicalize_raises_only_invalid_url_and_is_idempotent(url: str) -> None:
    canonical = _canonical(url)
    if canonical is None:
        return
    _assert_crawlable(canonical)
    assert canonicalize(canonical) == canonical
    # Not an artefact of the fast path or the cache: the full canonicalisation agrees.
    assert urls._canonicalize(url.strip()) == canonical


# --- target derivation and scope ------------------------------------------------------------


@FUZZ
@given(URLS, st.sampled_from(["host", "domain"]))
@example("http://0.A.", "host")  # nightly: the target kept the trailing dot in host mode
@example("http://0.A.", "domain")
def test_target_of_never_raises_and_is_stable_under_canonicalisation(url: str,
                                                                     mode: str) -> None:
    canonical = _canonical(url)
    if canonical is None:
        return
    target = target_of(canonical, mode)
    assert isinstance(target, str) and target
    assert target_of(canonicalize(canonical), mode) == target
    assert target == target.lower()
    # The target is a suffix of the host, so its partition follows the host.
    assert host_of(canonical).rstrip(".").endswith(target)
    assert not target.endswith("."), target  # "a.example." is a.example: one site, one cap
    assert origin_of(canonical).startswith(canonical.split(":", 1)[0])


@FUZZ
@given(URLS, URLS, st.sampled_from(["same-target", "seeds", "any"]),
       st.sampled_from(["host", "domain"]), st.integers(-1, 3), st.integers(-1, 3))
@example("", "http://[::1%\x80]", "same-target", "host", 0, 0)  # nightly: a zone id raised
def test_scope_check_never_raises(link: str, page: str, scope: str, mode: str, depth: int,
                                  max_depth: int) -> None:
    canonical_link, canonical_page = _canonical(link), _canonical(page)
    if canonical_link is None or canonical_page is None:
        return
    page_target = target_of(canonical_page, mode)
    decided = follow(canonical_link, page_target, depth, scope=scope, max_depth=max_depth,
                     target_mode=mode, allowed={page_target})
    assert decided in (True, False)
    again = follow(canonicalize(canonical_link), page_target, depth, scope=scope,
                   max_depth=max_depth, target_mode=mode, allowed={page_target})
    assert again == decided


# --- link resolution and extraction ----------------------------------------------------------


@FUZZ
@given(URLS, HREFS)
@example("http://example.com/a/b", "../../../../c")
@example("http://example.com/", "//[::1")
@example("http://example.com/", "/\\evil.example/")
@example("http://example.com", "/x")
@example("http://\\", "0")  # was "http:////0": a backslash host, rewritten by w3lib
def test_resolve_link_returns_none_or_a_canonical_http_url(base: str, href: str) -> None:
    link = resolve_link(base, href)
    if link is not None:
        _assert_crawlable(link)
    # Against a canonical base, as the parse stage calls it.
    canonical_base = _canonical(base)
    if canonical_base is not None:
        link = resolve_link(canonical_base, href)
        if link is not None:
            _assert_crawlable(link)
            assert resolve_link(canonical_base, link) == link


def _page(base_href: str | None, hrefs: list[str], junk: str) -> str:
    base = "" if base_href is None else f'<base href="{base_href}">'
    anchors = "".join(f"<a href='{h}'>x</a>{junk}" for h in hrefs)
    return f"<html><head>{base}<title>t</title></head><body>{anchors}</body></html>"


_CONTENT_TYPES = st.sampled_from(["text/html", "text/html; charset=utf-8", "",
                                  "text/html; charset=idna", "text/html; charset=utf-7",
                                  "text/html; charset=nonsense", "application/xhtml+xml",
                                  "text/html; charset=utf-16", "text/html; charset=\x00"])


@FUZZ
@given(st.binary(max_size=2000), URLS, _CONTENT_TYPES)
def test_extract_never_raises_on_arbitrary_bytes(body: bytes, base: str, ctype: str) -> None:
    page = extract(body, base, ctype)
    for link in page.links:
        _assert_crawlable(link)


@FUZZ
@given(st.one_of(st.none(), HREFS), st.lists(HREFS, max_size=8), URLS,
       st.sampled_from(["", "<", "</a", "<base href=//x.example/>", "\x00", "&amp;", "<!--"]))
def test_extract_links_are_canonical_http_urls(base_href: str | None, hrefs: list[str],
                                               base: str, junk: str) -> None:
    body = _page(base_href, hrefs, junk).encode("utf-8", "surrogatepass")
    page = extract(body, base)
    assert len(page.links) == len(set(page.links))
    for link in page.links:
        _assert_crawlable(link)


# --- Avro codec ----------------------------------------------------------------------------------

_RECORDS = sorted({spec.record for spec in Topology().specs()})
_FINGERPRINTS = sorted({v.fingerprint for r in _RECORDS for v in default_codec().versions(r)})
_HEADER_VALUE = st.one_of(st.none(), st.binary(max_size=24), st.text(max_size=24),
                          st.sampled_from(_FINGERPRINTS),
                          st.sampled_from(_FINGERPRINTS).map(str.encode))


@st.composite
def headers(draw: st.DrawFn) -> object:
    """Absent, empty, list or dict headers, with a schema header that may be right."""
    pairs = draw(st.lists(st.tuples(st.sampled_from([HEADER_SCHEMA, "cf-target", "x", ""]),
                                    _HEADER_VALUE), max_size=3))
    if draw(st.booleans()):
        pairs.append((HEADER_SCHEMA, draw(_HEADER_VALUE)))
    shape = draw(st.sampled_from(["list", "dict", "none"]))
    return None if shape == "none" else dict(pairs) if shape == "dict" else pairs


def test_every_topology_record_is_fuzzed() -> None:
    assert {"CrawlJob", "FetchResult", "ParsedPage", "DeadLetter", "FetchEvent", "Seen",
            "Control"} <= set(_RECORDS)


@FUZZ
@given(st.sampled_from(_RECORDS), st.one_of(st.none(), st.binary(max_size=512),
                                            st.text(max_size=64)), headers())
def test_decoder_raises_only_decode_error(record: str, payload: bytes | str | None,
                                          hdrs: object) -> None:
    try:
        value = default_codec().decode(record, payload, hdrs)  # type: ignore[arg-type]
    except DecodeError:
        return
    assert isinstance(value, dict)


@FUZZ
@given(st.sampled_from(_RECORDS), st.binary(max_size=512))
def test_decoder_on_random_bytes_with_the_right_schema_header(record: str,
                                                              payload: bytes) -> None:
    codec = default_codec()
    for version in codec.versions(record):
        try:
            value = codec.decode(record, payload, [(HEADER_SCHEMA, version.fingerprint.encode())])
        except DecodeError:
            continue
        assert isinstance(value, dict)


# --- the store's rows and robots.txt rules ------------------------------------------------

_LONG = st.integers(-(2**63), 2**63 - 1)
_TEXT = st.text(max_size=40)


@FUZZ
@given(st.fixed_dictionaries({
    "dedupe_key": _TEXT, "url": _TEXT, "final_url": _TEXT, "target": _TEXT, "profile": _TEXT,
    "depth": _LONG, "status": _LONG, "content_type": _TEXT, "title": _TEXT, "text": _TEXT,
    "links": st.lists(_TEXT, max_size=3), "body_bytes": _LONG, "fetched_at_ms": _LONG,
    "fetch_worker": _TEXT, "parse_worker": _TEXT, "parsed_at_ms": _LONG}),
    st.fixed_dictionaries({
    "ts_ms": _LONG, "url": _TEXT, "target": _TEXT, "profile": _TEXT, "attempt": _LONG,
    "status": _LONG, "outcome": _TEXT, "reason": _TEXT, "elapsed_ms": _LONG, "bytes": _LONG,
    "worker": _TEXT, "fetcher_version": _TEXT, "http_version": _TEXT, "tls_version": _TEXT,
    "profile_bundle_version": _TEXT, "code_revision": _TEXT}))
def test_a_decoded_record_becomes_a_row_or_a_decode_error(page: dict[str, object],
                                                          event: dict[str, object]) -> None:
    from consumers.store import event_row, fits, page_row
    for table, build in (("pages", lambda: page_row(page)),
                         ("fetch_events", lambda: event_row("t:0:1", event))):
        try:
            row = fits(table, build())
        except DecodeError:
            continue
        assert all(v is not None for v in row)


@FUZZ
@given(st.one_of(st.none(), st.integers(100, 599)), st.binary(max_size=2000),
       st.lists(st.sampled_from(["Crawl-delay: ", "Request-rate: ", "User-agent: ",
                                 "Disallow: ", "Allow: "]), max_size=6),
       st.lists(st.sampled_from(["nan", "inf", "-inf", "-5", "1e999", "0", "0.5", "3/0",
                                 "1/1e-9", "10/60", "*", "crawlfleet", "/x", "", "\x00"]),
                max_size=6))
def test_any_robots_answer_gives_rules_with_a_finite_interval(
        status: int | None, body: bytes, keys: list[str], values: list[str]) -> None:
    from consumers.fetch.robots import rules_from_response
    text = "\n".join(k + v for k, v in zip(keys, values, strict=False)).encode()
    rules = rules_from_response(status, b"User-agent: *\n" + text + b"\n" + body, "crawlfleet")
    assert 0.0 <= rules.min_interval_s < float("inf")
    if rules.parser is not None:
        rules.parser.can_fetch("http://x.test/a", "crawlfleet")


def test_a_forged_timestamp_is_refused_on_its_own_not_its_batch() -> None:
    """Found by the row fuzz: a record timed 2**62 ms decoded fine and then raised an
    OverflowError the store did not catch, so its batch failed on every replay."""
    import pytest

    from consumers.store import page_row
    page = {"dedupe_key": "k", "url": "u", "final_url": "u", "target": "t", "profile": "p",
            "depth": 0, "status": 200, "content_type": "", "title": "", "text": "",
            "links": [], "body_bytes": 0, "fetched_at_ms": 2**62, "fetch_worker": "w",
            "parse_worker": "w", "parsed_at_ms": 0}
    with pytest.raises(DecodeError, match="outside what the store holds"):
        page_row(page)
    assert page_row({**page, "fetched_at_ms": 1_700_000_000_123})[12].year == 2023
