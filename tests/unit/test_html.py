"""HTML → title, visible text and crawlable links."""

from __future__ import annotations

import pytest

from consumers.html import (
    MAX_LINKS,
    MAX_TEXT_CHARS,
    decode_html,
    extract,
    is_html,
    usable_encoding,
)

BASE = "https://example.com/dir/page.html"

PAGE = b"""<!doctype html>
<html><head>
<title>  Example   Page </title>
<style>.hidden { color: red }</style>
<script>var secretScript = "do not index";</script>
</head>
<body>
<h1>Welcome</h1>
<p>Visible <b>paragraph</b> text.</p>
<script>alert("inline script")</script>
<noscript>Enable JS please</noscript>
<template><p>template content</p></template>
<a href="other.html">relative</a>
<a href="/root">root</a>
<a href="https://Other.ORG/x?b=2&amp;a=1#frag">absolute</a>
<a href="other.html#section">same page as first link</a>
<a href="sub/">sub</a>
<a href="/root">root again</a>
<a href="hidden.html" rel="nofollow">nofollow</a>
<a href="hidden2.html" rel="noopener NoFollow">nofollow mixed case</a>
<a href="#top">fragment only</a>
<a href="javascript:void(0)">js</a>
<a href="mailto:someone@example.com">mail</a>
<a href="tel:+100">tel</a>
<a>no href</a>
</body></html>
"""


def test_title() -> None:
    assert extract(PAGE, BASE).title == "Example   Page"


def test_text_excludes_script_style_noscript_template() -> None:
    text = extract(PAGE, BASE).text
    assert "Welcome" in text
    assert "Visible paragraph text." in text
    for hidden in ("secretScript", "inline script", "color: red", "Enable JS",
                   "template content"):
        assert hidden not in text


def test_links_resolved_deduplicated_in_order_without_nofollow() -> None:
    assert extract(PAGE, BASE).links == [
        "https://example.com/dir/other.html",
        "https://example.com/root",
        "https://other.org/x?a=1&b=2",
        "https://example.com/dir/sub/",
    ]


def test_base_href_changes_resolution() -> None:
    html = (b'<html><head><base href="https://cdn.example.net/assets/"></head>'
            b'<body><a href="a.html">a</a><a href="/b">b</a>'
            b'<a href="https://example.com/c">c</a></body></html>')
    assert extract(html, BASE).links == [
        "https://cdn.example.net/assets/a.html",
        "https://cdn.example.net/b",
        "https://example.com/c",
    ]


def test_relative_base_href_is_resolved_against_the_page() -> None:
    html = b'<head><base href="/other/dir/"></head><a href="x.html">x</a>'
    assert extract(html, BASE).links == ["https://example.com/other/dir/x.html"]


def test_unusable_base_href_falls_back_to_page_url() -> None:
    html = b'<head><base href="javascript:evil()"></head><a href="x.html">x</a>'
    assert extract(html, BASE).links == ["https://example.com/dir/x.html"]


def test_links_are_capped() -> None:
    html = "".join(f'<a href="/p{i}">p</a>' for i in range(MAX_LINKS + 50)).encode()
    links = extract(html, BASE).links
    assert len(links) == MAX_LINKS
    assert links[0] == "https://example.com/p0"


def test_text_is_capped() -> None:
    html = b"<body><p>" + b"word " * (MAX_TEXT_CHARS // 2) + b"</p></body>"
    assert len(extract(html, BASE).text) == MAX_TEXT_CHARS


@pytest.mark.parametrize("content_type", ["application/json", "image/png", "text/plain",
                                          "application/pdf; charset=utf-8"])
def test_non_html_is_empty(content_type: str) -> None:
    out = extract(PAGE, BASE, content_type)
    assert (out.title, out.text, out.links) == ("", "", [])


@pytest.mark.parametrize("content_type", ["text/html", "TEXT/HTML; charset=UTF-8",
                                          "application/xhtml+xml", ""])
def test_html_content_types(content_type: str) -> None:
    assert is_html(content_type)
    assert extract(PAGE, BASE, content_type).title == "Example   Page"


def test_empty_body() -> None:
    out = extract(b"", BASE)
    assert (out.title, out.text, out.links) == ("", "", [])


def test_charset_from_content_type() -> None:
    body = "<title>Café</title><body>été à Zürich</body>".encode("iso-8859-1")
    out = extract(body, BASE, "text/html; charset=ISO-8859-1")
    assert out.title == "Café"
    assert out.text == "été à Zürich"


def test_quoted_charset() -> None:
    body = "<title>Привет</title>".encode("koi8-r")
    assert extract(body, BASE, 'text/html; charset="KOI8-R"').title == "Привет"


def test_default_charset_is_utf8() -> None:
    body = "<title>Café ✓</title>".encode()
    assert extract(body, BASE, "text/html").title == "Café ✓"


def test_unknown_charset_falls_back_to_utf8() -> None:
    body = "<title>Café</title>".encode()
    assert extract(body, BASE, "text/html; charset=no-such-charset").title == "Café"


def test_undecodable_bytes_are_replaced_not_raised() -> None:
    out = extract(b"<title>bad \xff\xfe bytes</title>", BASE, "text/html; charset=utf-8")
    assert out.title.startswith("bad ")
    assert "\ufffd" in out.title


@pytest.mark.parametrize("body", [
    b"<html><body><p>unclosed <a href='/x'>x<div><table><tr><td>cell</b></i>",
    b"<<<>>><a href=>",
    b"\x00\x01\x02 binary junk \xff",
    b"<a href='http://[broken-ipv6/'>bad</a><a href='/ok'>ok</a>",
    b"<a href='http://example.com:99999/'>bad port</a>",
    b"<!-- unterminated comment <a href='/x'>",
    b"<base href='http://[::1'><a href='/y'>y</a>",
])
def test_malformed_html_does_not_raise(body: bytes) -> None:
    out = extract(body, BASE)
    assert isinstance(out.text, str)
    assert all(link.startswith("https://") for link in out.links)


def test_malformed_link_does_not_hide_good_ones() -> None:
    body = b"<a href='http://[broken-ipv6/'>bad</a><a href='/ok'>ok</a>"
    assert extract(body, BASE).links == ["https://example.com/ok"]


def test_no_title() -> None:
    assert extract(b"<body><p>hi</p></body>", BASE).title == ""


# --- hostile charsets: decoded with replacement, never raised ------------------------------

HOSTILE_CHARSETS = ["idna", "punycode", "undefined", "utf-7", "rot13", "base64", "hex", "zlib",
                    "uu", "bogus-charset", "", "\"utf-8", "utf-16", "utf-32", "x" * 300]


@pytest.mark.parametrize("charset", HOSTILE_CHARSETS)
@pytest.mark.parametrize("body", [
    b"<html><title>caf\xe9</title><a href='/x'>x</a>\xff\xfe\x00</html>",
    b"\xff\xfe<\x00t\x00",  # a UTF-16 BOM, odd length
    b"<meta charset=idna><title>t</title><p>x\xe9",
    b"<meta http-equiv='Content-Type' content='text/html; charset=rot13'><p>\x80\x81",
    b"\xef\xbb\xbf<title>bom</title>",
])
def test_hostile_charset_never_raises(charset: str, body: bytes) -> None:
    ct = f"text/html; charset={charset}"
    enc, text = decode_html(body, ct)
    assert usable_encoding(enc) and isinstance(text, str)
    extract(body, "http://a.test/", ct)  # and the whole extraction survives it


def test_charset_from_meta_and_bom() -> None:
    assert decode_html("<meta charset='iso-8859-1'><title>caf\xe9</title>".encode("latin-1"),
                       "text/html")[1].endswith("café</title>")
    assert decode_html(b"\xef\xbb\xbfcaf\xc3\xa9", "text/html; charset=latin-1") \
        == ("utf-8", "café")  # the BOM wins over the header


def test_not_a_text_encoding_is_unusable() -> None:
    assert usable_encoding("utf-8") and usable_encoding("cp1252") and usable_encoding("gbk")
    for name in ("idna", "punycode", "rot13", "base64", "utf-7", "nonsense", ""):
        assert not usable_encoding(name)
