"""HTML → title, text and links with selectolax (lexbor): pure functions."""

from __future__ import annotations

from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser

from crawlfleet.urls import resolve_link

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
    tree = LexborHTMLParser(body.decode(_charset(content_type), "replace"))
    title_node = tree.css_first("title")
    title = title_node.text(strip=True) if title_node else ""
    base = base_url
    base_node = tree.css_first("base[href]")
    if base_node is not None:
        resolved = resolve_link(base_url, base_node.attributes.get("href") or "")
        base = resolved or base_url
    links: dict[str, None] = {}
    for node in tree.css("a[href]"):
        rel = (node.attributes.get("rel") or "").lower()
        if "nofollow" in rel:
            continue
        url = resolve_link(base, node.attributes.get("href") or "")
        if url is not None:
            links[url] = None
            if len(links) >= MAX_LINKS:
                break
    tree.strip_tags(list(_SKIP_TAGS))
    body_node = tree.body
    text = body_node.text(separator=" ", strip=True) if body_node is not None else ""
    return Extracted(title[:1000], text[:MAX_TEXT_CHARS], list(links))


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        k, _, v = part.partition("=")
        if k.strip().lower() == "charset" and v.strip():
            cs = v.strip().strip('"').lower()
            try:
                "".encode(cs)
            except LookupError:
                return "utf-8"
            return cs
    return "utf-8"
