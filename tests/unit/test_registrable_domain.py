"""Targets and scope in ``domain`` mode come from the Public Suffix List, and a job whose
target or scope today's rules see differently is never fetched as it was."""

from __future__ import annotations

import pytest

from consumers.scope import OUT_OF_SCOPE, REROUTE, follow, recheck
from core.urls import target_of


@pytest.mark.parametrize(("url", "domain"), [
    ("https://a.github.io/x", "a.github.io"),  # a private suffix: one site per user
    ("https://b.github.io/x", "b.github.io"),
    ("https://www.example.co.uk/", "example.co.uk"),
    ("https://a.b.example.com/", "example.com"),
    ("https://shop.example.com.au/", "example.com.au"),
    ("https://x.y.example.kawasaki.jp/", "y.example.kawasaki.jp"),  # a wildcard rule
    ("http://localhost:8080/", "localhost"),
    ("http://127.0.0.2:8080/", "127.0.0.2"),
])
def test_domain_targets_follow_the_public_suffix_list(url: str, domain: str) -> None:
    assert target_of(url, "domain") == domain


def test_two_github_pages_sites_are_two_scopes() -> None:
    kw = {"scope": "same-target", "max_depth": -1, "target_mode": "domain"}
    assert not follow("https://b.github.io/", "a.github.io", 0, **kw)
    assert follow("https://www.a.github.io/", "a.github.io", 0, **kw)


def _job(url: str, target: str, parent: str | None = None) -> dict[str, object]:
    return {"url": url, "target": target, "parent_url": parent}


def test_a_job_made_under_another_target_rule_is_rerouted() -> None:
    # made in domain mode, fetched in host mode (or the other way round): its own target now
    assert recheck(_job("https://www.example.com/a", "example.com"), scope="any",
                   target_mode="host") == REROUTE
    assert recheck(_job("https://a.github.io/a", "github.io"), scope="any",
                   target_mode="domain") == REROUTE
    assert recheck(_job("https://www.example.com/a", "www.example.com"), scope="any",
                   target_mode="host") is None


def test_a_replayed_link_now_out_of_scope_is_not_fetched() -> None:
    job = _job("https://other.test/a", "other.test", parent="https://site.test/")
    assert recheck(job, scope="any", target_mode="host") is None
    assert recheck(job, scope="same-target", target_mode="host") == OUT_OF_SCOPE
    assert recheck(job, scope="seeds", target_mode="host", allowed={"site.test"}) == \
        OUT_OF_SCOPE
    seed = _job("https://other.test/a", "other.test")
    assert recheck(seed, scope="same-target", target_mode="host") is None  # seeds are in
