"""Which discovered links a crawl follows: pure rules."""

from __future__ import annotations

from collections.abc import Collection

from crawlfleet.urls import target_of


def follow(link: str, page_target: str, depth: int, *, scope: str, max_depth: int,
           target_mode: str = "host", allowed: Collection[str] = ()) -> bool:
    """True if ``link`` found on a page at ``depth`` of ``page_target`` should be crawled."""
    if max_depth >= 0 and depth + 1 > max_depth:
        return False
    if scope == "same-target":
        return target_of(link, target_mode) == page_target
    if scope == "seeds":
        return target_of(link, target_mode) in allowed
    return True
