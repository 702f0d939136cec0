"""HTML → title, text and links with selectolax (lexbor): pure functions."""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser
from w3lib.encoding import html_to_unicode, http_content_type_encoding

from core.urls import resolve_link

MAX_TEXT_CHARS = 65536
MAX_LINKS = 2000
_SKIP_TAGS = ("script", "style", "noscript", "template")


@dataclass(frozen=True)
class Extracted:
    title: str
    text: str
    links: list[str]  # canonical absolute URLs, first occurrence order, no duplicates


def is_html(content_type: str) -> bool:
    ct = content_type.split(";", 1)[0].strip().lower()
    return ct in ("", "text/html", "application/xhtml+xml")


def extract(body: bytes, base_url: str, content_type: str = "text/html") -> Extracted:
    """Title, visible text and crawlable links of an HTML page (empty for non-HTML)."""
    if not is_html(content_type) or not body:
        return Extracted("", "", [])
    tree = LexborHTMLParser(decode_html(body, content_type)[1])
    # Elements by tag name, not CSS selectors: a tree's first CSS query sets up lexbor's
    # selector engine, ~35 us per page, more than half of what parsing the page costs.
    titles = tree.tags("title")
    title = titles[0].text(strip=True) if titles else ""
    base = base_url
    base_href = next((h for h in (n.attributes.get("href") for n in tree.tags("base"))
                      if h is not None), None)
    if base_href is not None:
        base = resolve_link(base_url, base_href) or base_url
    links: dict[str, None] = {}
    for node in tree.tags("a"):
        attrs = node.attributes
        href = attrs.get("href")
        if href is None or "nofollow" in (attrs.get("rel") or "").lower():
            continue
        url = resolve_link(base, href)
        if url is not None:
            links[url] = None
            if len(links) >= MAX_LINKS:
                break
    tree.strip_tags(list(_SKIP_TAGS))
    body_node = tree.body
    text = body_node.text(separator=" ", strip=True) if body_node is not None else ""
    return Extracted(title[:1000], text[:MAX_TEXT_CHARS], list(links))


#: Codecs Python has that no web page is written in: they raise even with "replace"
#: (idna, punycode, undefined) or turn markup into something else (utf-7).
_NOT_PAGE_ENCODINGS = frozenset({"idna", "punycode", "undefined", "utf-7", "raw-unicode-escape",
                                 "unicode-escape", "palmos", "mbcs", "oem"})


def usable_encoding(name: str) -> bool:
    """True if ``name`` is a text encoding a page may be decoded with."""
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError):
        return False
    return bool(info._is_text_encoding) and info.name not in _NOT_PAGE_ENCODINGS


def decode_html(body: bytes, content_type: str = "text/html") -> tuple[str, str]:
    """(encoding, text) of an HTML body: BOM, then the header's charset, then ``<meta>``,
    then UTF-8 (w3lib's ``html_to_unicode``), with replacement characters for bad bytes.

    Never raises: a declared charset that is not a usable text encoding (``idna``,
    ``rot13``, ``base64``, unknown names) is ignored, and if decoding still fails the page
    is read as UTF-8 with replacements.
    """
    declared = http_content_type_encoding(content_type)
    header = content_type if declared is None or usable_encoding(declared) else "text/html"
    try:
        enc, text = html_to_unicode(header, body, default_encoding="utf-8")
    except (UnicodeError, LookupError, ValueError):
        return "utf-8", body.decode("utf-8", "replace")
    if not usable_encoding(enc):  # a <meta> charset w3lib accepted but a page cannot have
        return "utf-8", body.decode("utf-8", "replace")
    return enc, text
