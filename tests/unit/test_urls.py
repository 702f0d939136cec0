"""URL canonicalisation, targets, link resolution and the SSRF guard."""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ForbiddenAddressError, InvalidURLError
from core.urls import (
    MAX_URL_LENGTH,
    _already_canonical,
    _canonicalize,
    canonicalize,
    check_address,
    host_of,
    origin_of,
    resolve_link,
    target_of,
)
from schemas.keys import dedupe_key

# --- canonicalize -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("HTTP://Example.COM/Path", "http://example.com/Path"),  # path case is kept
        ("HtTpS://WWW.Example.Com/", "https://www.example.com/"),
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:443/a", "http://example.com:443/a"),  # 443 is not http's default
        ("https://example.com:8443/a", "https://example.com:8443/a"),
        ("http://example.com/a#section-2", "http://example.com/a"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com?q=1", "http://example.com/?q=1"),
        ("  http://example.com/a  ", "http://example.com/a"),
        ("http://bücher.de/", "http://xn--bcher-kva.de/"),
        ("http://BÜCHER.de/", "http://xn--bcher-kva.de/"),
        ("http://127.0.0.1:8080/x", "http://127.0.0.1:8080/x"),
        ("http://[::1]:8080/x", "http://[::1]:8080/x"),
    ],
)
def test_canonicalize_normalises(raw: str, canonical: str) -> None:
    assert canonicalize(raw) == canonical


def test_query_order_does_not_matter() -> None:
    a = canonicalize("http://example.com/p?b=2&a=1")
    b = canonicalize("http://example.com/p?a=1&b=2")
    assert a == b == "http://example.com/p?a=1&b=2"


def test_canonicalize_is_idempotent() -> None:
    for raw in ("HTTP://Example.COM:80/a b?z=1&a=2#f", "https://bücher.de:8443/straße?x=ü"):
        once = canonicalize(raw)
        assert canonicalize(once) == once


def test_distinct_pages_stay_distinct() -> None:
    assert canonicalize("http://example.com/a") != canonicalize("http://example.com/b")
    assert canonicalize("http://example.com/") != canonicalize("https://example.com/")
    assert canonicalize("http://example.com/?a=1") != canonicalize("http://example.com/?a=2")
    assert canonicalize("http://example.com:8080/") != canonicalize("http://example.com/")


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        "ftp://example.com/file",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "mailto:someone@example.com",
        "/relative/path",
        "example.com/no-scheme",
        "http:///no-host",
        "http://example.com:99999/",
        "http://example.com:port/",
        "http://[::1/",
        "http://example.com/" + "a" * MAX_URL_LENGTH,
        # Forbidden in a host name (found by fuzzing: w3lib rewrote "\\" to "/", moving the
        # host into the path, and kept the others, which no host can contain).
        "http://\\/0",
        "http://a\\b/",
        "http://a b/",
        "http://a|b/",
        "http://a^b/",
        "http://a<b>/",
        "http://ex%61mple.com/",
        "http://a\x7fb/",
    ],
)
def test_canonicalize_rejects(raw: str) -> None:
    with pytest.raises(InvalidURLError):
        canonicalize(raw)


def test_a_url_that_encoding_makes_too_long_is_rejected() -> None:
    """Found by fuzzing: 4,000 characters became 4,000+ once percent-encoded, so the result
    was one that canonicalize itself then refused (not idempotent)."""
    raw = "http://example.com/" + "é" * 2000
    assert len(raw) <= MAX_URL_LENGTH
    with pytest.raises(InvalidURLError, match="once encoded"):
        canonicalize(raw)


def test_max_length_boundary() -> None:
    prefix = "http://example.com/"
    ok = prefix + "a" * (MAX_URL_LENGTH - len(prefix))
    assert canonicalize(ok) == ok
    with pytest.raises(InvalidURLError):
        canonicalize(ok + "a")


# --- target_of ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "mode", "target"),
    [
        ("https://www.example.com/a", "host", "www.example.com"),
        ("https://www.example.com:8443/a", "host", "www.example.com"),
        ("https://a.b.example.com/a", "domain", "example.com"),
        ("https://example.com/a", "domain", "example.com"),
        ("https://www.example.co.uk/a", "domain", "example.co.uk"),
        ("https://a.b.example.co.uk/a", "domain", "example.co.uk"),
        ("https://shop.example.com.au/", "domain", "example.com.au"),
        ("https://www.example.co.uk/a", "host", "www.example.co.uk"),
        ("http://10.1.2.3:8080/", "domain", "10.1.2.3"),
        ("http://10.1.2.3:8080/", "host", "10.1.2.3"),
        ("http://[2001:db8::1]/", "domain", "2001:db8::1"),
        ("http://localhost:8080/", "domain", "localhost"),
    ],
)
def test_target_of(url: str, mode: str, target: str) -> None:
    assert target_of(url, mode) == target


def test_target_of_defaults_to_host_mode() -> None:
    assert target_of("https://www.example.com/") == "www.example.com"


def test_domain_mode_does_not_keep_three_labels_for_a_long_tld() -> None:
    # "co" is a second-level suffix only under a two-letter country code.
    assert target_of("https://www.foo.co.travel/", "domain") == "co.travel"
    assert target_of("https://a.example.org/", "domain") == "example.org"


# --- resolve_link -------------------------------------------------------------------------

BASE = "https://example.com/dir/page.html?x=1"


@pytest.mark.parametrize(
    ("href", "resolved"),
    [
        ("other.html", "https://example.com/dir/other.html"),
        ("../up", "https://example.com/up"),
        ("/abs", "https://example.com/abs"),
        ("?q=2", "https://example.com/dir/page.html?q=2"),
        ("//cdn.example.org/x", "https://cdn.example.org/x"),
        ("https://Other.COM/p?b=1&a=2#frag", "https://other.com/p?a=2&b=1"),
        ("  spaced.html  ", "https://example.com/dir/spaced.html"),
        ("sub/#frag", "https://example.com/dir/sub/"),
    ],
)
def test_resolve_link(href: str, resolved: str) -> None:
    assert resolve_link(BASE, href) == resolved


@pytest.mark.parametrize(
    "href",
    [
        "",
        "   ",
        "#frag",
        "#",
        "javascript:void(0)",
        " JavaScript:alert(1)",
        "mailto:a@example.com",
        "tel:+123456",
        "data:text/html,hi",
        "ftp://example.com/file",
        "http://example.com:99999/",
        "http://[broken-ipv6/",
    ],
)
def test_resolve_link_not_crawlable(href: str) -> None:
    assert resolve_link(BASE, href) is None


_BASES = [
    "https://example.com/dir/page.html?x=1",
    "http://user:pw@example.com:8080/a/b/c",
    "http://127.0.0.2:18500/p/12.html",
    "http://[::1]:8080/x/",
    "https://example.com/",
]
_HREFS = [
    "/abs", "/a/../b/./c", "/p?b=2&a=1#f", "/%7Euser/caf%C3%A9", "/ space",
    "https://Other.COM/p?b=1&a=2#frag", "http://example.com:80/x", "HTTP://EXAMPLE.com/",
    "https://[::1]:443/", "rel/x.html", "?only=query", "//proto.relative/x", "/",
]


@pytest.mark.parametrize("base", _BASES)
def test_memoised_resolution_equals_urljoin_then_canonicalize(base: str) -> None:
    # Site-absolute and absolute hrefs are cached by origin: the cache must never change
    # an answer, whichever page of the origin asked first.
    for href in _HREFS:
        try:
            expected: str | None = canonicalize(urljoin(base, href))
        except InvalidURLError:
            expected = None
        assert resolve_link(base, href) == expected, href
        assert resolve_link(base, href) == expected, f"{href} (cached)"


def test_site_absolute_href_is_resolved_against_each_pages_own_origin() -> None:
    assert resolve_link("http://a.example/x/y", "/z") == "http://a.example/z"
    assert resolve_link("http://b.example/x/y", "/z") == "http://b.example/z"
    assert resolve_link("https://a.example/x/y", "/z") == "https://a.example/z"


# --- check_address ------------------------------------------------------------------------

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata endpoint (link-local)
    "fe80::1",
    "fc00::1",
    "0.0.0.0",
    "224.0.0.1",
    "::ffff:127.0.0.1",
    "100.100.100.200",  # shared address space (RFC 6598), a cloud metadata endpoint too
]


@pytest.mark.parametrize("ip", REFUSED)
def test_non_public_addresses_are_refused(ip: str) -> None:
    with pytest.raises(ForbiddenAddressError):
        check_address(ip, allow_private=False)


@pytest.mark.parametrize("ip", REFUSED)
def test_non_public_addresses_allowed_on_request(ip: str) -> None:
    check_address(ip, allow_private=True)


@pytest.mark.parametrize("ip", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2001:4860:4860::8888"])
def test_public_addresses_are_allowed(ip: str) -> None:
    check_address(ip, allow_private=False)


def test_forbidden_address_is_an_invalid_url() -> None:
    # Stages dead-letter InvalidURLError; a refused address must be handled the same way.
    with pytest.raises(InvalidURLError):
        check_address("127.0.0.1", allow_private=False)


# --- dedupe_key ---------------------------------------------------------------------------


def test_dedupe_key_combines_profile_and_url() -> None:
    url = canonicalize("http://example.com/a")
    assert dedupe_key("default", url) == "default|http://example.com/a"
    assert dedupe_key("default", url) != dedupe_key("mobile", url)
    assert dedupe_key("default", url) != dedupe_key("default", canonicalize("http://example.com/b"))


def test_equivalent_urls_share_a_dedupe_key() -> None:
    a = dedupe_key("p", canonicalize("HTTP://Example.com:80/x?b=2&a=1#top"))
    b = dedupe_key("p", canonicalize("http://example.com/x?a=1&b=2"))
    assert a == b


def _slow_or_error(url: str) -> str:
    try:
        return _canonicalize(url)
    except InvalidURLError:
        return "<invalid>"


def _fast_or_error(url: str) -> str:
    try:
        return canonicalize(url)
    except InvalidURLError:
        return "<invalid>"


_HOSTS = ["example.com", "a-b.example.com", "127.0.0.2", "localhost", "xn--bcher-kva.de",
          "xn--invalid-.de", "-lead.example", "trail-.example", "a" * 63 + ".com",
          "a" * 64 + ".com", "example.com.", "Example.com", "a..b", "0x7f000001", "1.2.3",
          "256.1.1.1", "123", "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 61]
_PORTS = ["", ":80", ":443", ":8080", ":0", ":080", ":65535", ":65536", ":99999"]
_PATHS = ["", "/", "/a/b.html", "/a/../b", "/./x", "/a/.", "/~user/x_y-z.html", "/a//b",
          "/%7Euser", "/a b", "/a;p=1", "/a?", "/a?b=1", "/a#", "/a#f", "/é", "/A.HTML",
          "/a?b=1&a=2", "/a?a=2&a=1&a=", "/a?a", "/a?=1", "/a?a=1&&b=2", "/a?b=%41&a=1",
          "/a?b=1;a=2", "/a?b+c=1&a=2", "/a?B=1&a=1", "/a?a-b=0&a=1", "/a?t~=1&a.b=_-",
          "/a?b=1&a=2#f", "/a?b=é&a=1"]


@pytest.mark.parametrize("scheme", ["http", "https", "HTTP"])
def test_plain_url_fast_path_agrees_with_w3lib(scheme: str) -> None:
    """URLs taken as canonical without w3lib get exactly w3lib's answer (or its error)."""
    for host in _HOSTS:
        for port in _PORTS:
            for path in _PATHS:
                url = f"{scheme}://{host}{port}{path}"
                assert _fast_or_error(url) == _slow_or_error(url), url


_QUERY_CHARS = st.text(alphabet="aAbZ09._~-+%=&;é ", max_size=6)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_QUERY_CHARS, _QUERY_CHARS), min_size=1, max_size=6))
def test_a_query_fast_path_agrees_with_w3lib(pairs: list[tuple[str, str]]) -> None:
    """Queries sorted without w3lib (unreserved ``key=value`` pairs) get w3lib's order; any
    other query is left to w3lib, so the answer is always w3lib's."""
    url = "http://example.com:8080/list?" + "&".join(f"{k}={v}" for k, v in pairs)
    assert _fast_or_error(url) == _slow_or_error(url), url


def test_plain_urls_skip_w3lib() -> None:
    assert _already_canonical("http://127.0.0.2:18500/p/12.html")
    assert _already_canonical("https://www.example.com/a/b-c_d.html")
    assert _already_canonical("http://127.0.0.2:8080/list?id=5&sort=name&utm_source=x")
    for url in ("http://example.com:80/", "http://Example.com/", "http://example.com/?q",
                "http://example.com", "http://xn--bcher-kva.de/", "http://[::1]/",
                "http://example.com/list?sort=name&id=5", "http://example.com/?a=%41"):
        assert not _already_canonical(url), url


@pytest.mark.parametrize("raw", [
    "http://example.com", "HTTP://Example.COM:80/a/b?q=1#f", "https://user:pw@h.example:8443/x",
    "http://127.0.0.2:18500/p/1.html", "http://[::1]:8080/", "https://h.example?x=1",
    "http://xn--bcher-kva.example/b%C3%BCcher", "http://h.example/a//b/../c",
])
def test_origin_of_a_canonical_url_is_its_scheme_and_netloc(raw: str) -> None:
    url = canonicalize(raw)
    parts = urlsplit(url)
    assert origin_of(url) == f"{parts.scheme}://{parts.netloc}"


@pytest.mark.parametrize("url", [
    "http://example.com/a", "https://a.b.example.com:8443/x?y=1", "http://127.0.0.2:18700/",
    "http://example.com?q=1", "http://example.com", "http://example.com.:81/p#f",
    "http://[::1]:8080/", "http://user@example.com/", "http://EXAMPLE.com/",
    "http://xn--bcher-kva.example/", "http://a_b.example/", "https://10.0.0.1/p/1.html",
])
def test_host_of_is_what_urlsplit_says(url: str) -> None:
    # host_of reads plain hosts without urlsplit; whatever it reads must be the same host
    assert host_of(url) == (urlsplit(url).hostname or "")


def test_host_of_agrees_with_urlsplit_on_canonical_urls() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
    hosts = st.lists(label, min_size=1, max_size=4).map(".".join)

    @given(st.sampled_from(["http", "https"]), hosts,
           st.one_of(st.none(), st.integers(1, 65535)), st.text(max_size=20))
    def check(scheme: str, host: str, port: int | None, path: str) -> None:
        raw = f"{scheme}://{host}{f':{port}' if port else ''}/{path}"
        try:
            url = canonicalize(raw)
        except InvalidURLError:
            return
        assert host_of(url) == (urlsplit(url).hostname or "")

    check()
