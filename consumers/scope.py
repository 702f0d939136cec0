"""Which discovered links a crawl follows: pure rules."""

from __future__ import annotations

from collections.abc import Collection

from core.urls import target_of
from schemas.records import CrawlJob

#: :func:`recheck` verdicts.
REROUTE, OUT_OF_SCOPE = "reroute", "out_of_scope"


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


def recheck(job: CrawlJob, *, scope: str, target_mode: str,
            allowed: Collection[str] = ()) -> str | None:
    """Whether a job may be fetched as it is, judged by today's rules from its URL alone
    (a replayed or retried job was made under the rules of its day): :data:`REROUTE` when
    its URL's target now differs from the one it carries (its cap and partition are the new
    target's), :data:`OUT_OF_SCOPE` when the page that led to it no longer covers it; None
    to fetch it. Seeds (no parent) are in scope by definition."""
    if target_of(job["url"], target_mode) != job["target"]:
        return REROUTE
    parent = job.get("parent_url")
    if parent and not follow(job["url"], target_of(parent, target_mode), 0, scope=scope,
                             max_depth=-1, target_mode=target_mode, allowed=allowed):
        return OUT_OF_SCOPE
    return None
