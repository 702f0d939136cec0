"""How the local sites write their pages: deterministic prose, HTML and pseudo-random links.

Shared by every generated site so a page's bytes and links are a pure function of its
number: the same arguments always give the same site, and nothing is stored per page.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from urllib.parse import urljoin

__all__ = ["filler_variants", "mix64", "prose", "render_page", "resolve_hrefs"]

# one string is easier to read than 36 one-word lines
_WORDS = (  # noqa: SIM905
    "crawler frontier politeness robots canonical fetch parse queue partition broker offset "
    "stream consumer producer latency throughput backoff retry schema record topic lag host "
    "delay token bucket page link anchor title render archive index shard replica commit"
).split()


def prose(count: int, words_per: int, salt: int) -> list[str]:
    """Deterministic filler prose: realistic enough for text extraction to do real work."""
    out = []
    x = salt * 2654435761 + 1
    for _ in range(count):
        words = []
        for _ in range(words_per):
            x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
            words.append(_WORDS[(x >> 33) % len(_WORDS)])
        out.append(" ".join(words).capitalize() + ".")
    return out


def render_page(
    title: str, hrefs: Iterable[str], paragraphs: Iterable[str], filler: str = ""
) -> str:
    items = "".join(f'<li><a href="{html.escape(h)}">{html.escape(h)}</a></li>\n' for h in hrefs)
    text = "".join(f"<p>{html.escape(p)}</p>\n" for p in paragraphs)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
        f"{text}<nav><ul>\n{items}</ul></nav>\n{filler}</body></html>\n"
    )


def resolve_hrefs(page_url: str, hrefs: Iterable[str]) -> tuple[str, ...]:
    """What a parser gets from ``hrefs``: absolute HTTP URLs, as written otherwise."""
    out = []
    for h in hrefs:
        absolute = urljoin(page_url, h)
        if absolute.startswith(("http://", "https://")):
            out.append(absolute)
    return tuple(out)


def mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap deterministic pseudo-random link target."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def filler_variants(target: int, variants: int) -> list[str]:
    """``variants`` HTML filler blocks of ~``target`` bytes each, to pad generated pages."""
    out: list[str] = []
    for v in range(variants):
        paras, size = [], 0
        for p in prose(max(1, target // 300 + 1), 40, v):
            if size >= target:
                break
            paras.append(f"<p>{p}</p>\n")
            size += len(paras[-1])
        out.append("".join(paras))
    return out
