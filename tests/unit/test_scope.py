"""Which discovered links a crawl follows."""

from __future__ import annotations

import pytest

from consumers.scope import follow


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        ("https://example.com/a", True),
        ("http://example.com:8080/b", True),  # same host, other scheme/port: same target
        ("https://www.example.com/a", False),
        ("https://other.org/a", False),
        ("https://example.com.evil.org/", False),
    ],
)
def test_same_target_host_mode(link: str, expected: bool) -> None:
    assert follow(link, "example.com", 0, scope="same-target", max_depth=-1) is expected


def test_same_target_domain_mode() -> None:
    kw = {"scope": "same-target", "max_depth": -1, "target_mode": "domain"}
    assert follow("https://www.example.co.uk/x", "example.co.uk", 0, **kw)
    assert follow("https://shop.example.co.uk/x", "example.co.uk", 0, **kw)
    assert not follow("https://other.co.uk/x", "example.co.uk", 0, **kw)
    # in host mode the subdomain is a different target
    assert not follow("https://www.example.co.uk/x", "example.co.uk", 0, scope="same-target",
                      max_depth=-1, target_mode="host")


def test_any_scope_follows_other_targets() -> None:
    assert follow("https://other.org/a", "example.com", 0, scope="any", max_depth=-1)


@pytest.mark.parametrize(
    ("depth", "max_depth", "expected"),
    [
        (0, 0, False),  # seeds only: no link is followed
        (0, 1, True),
        (1, 1, False),
        (1, 2, True),
        (2, 2, False),
        (5, 2, False),
        (0, -1, True),  # negative: unlimited
        (10_000, -1, True),
        (3, -5, True),
    ],
)
def test_max_depth(depth: int, max_depth: int, expected: bool) -> None:
    for scope in ("same-target", "any"):
        got = follow("https://example.com/x", "example.com", depth, scope=scope,
                     max_depth=max_depth)
        assert got is expected


def test_depth_limit_applies_before_scope() -> None:
    assert not follow("https://other.org/", "example.com", 3, scope="any", max_depth=3)
