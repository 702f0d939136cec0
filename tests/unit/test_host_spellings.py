"""Hosts canonicalised the way browsers read them (the WHATWG host parser): every spelling of
an IPv4 address is one dedupe key, one target and one policy decision -- and no URL that was
canonical before the change has a new key or target now (the corpus was written by the old
code: ``tests/unit/data/make_canonical_corpus.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InvalidURLError
from core.urls import (
    AddressPolicy,
    address_is_public,
    canonicalize,
    ends_in_number,
    host_of,
    target_of,
)
from schemas.keys import dedupe_key

CORPUS = Path(__file__).with_name("data") / "canonical_corpus.jsonl"
SPELLINGS = ("2130706433", "127.1", "0177.0.0.1", "127.000.000.001", "127.0.0.1.", "0x7f.1",
             "0x7F000001", "127.0.1",
             # digits that IDNA maps to ASCII ones (found by the nightly fuzz: "¹" gave
             # "http://1/", which canonicalised again to "http://0.0.0.1/")
             "\uff11\uff12\uff17.\uff11", "127.0.0.\u00b9")


@pytest.mark.parametrize("spelt", SPELLINGS)
def test_each_spelling_is_one_key_one_target_one_decision(spelt: str) -> None:
    url = canonicalize(f"http://{spelt}:8080/a?b=1")
    expected = "http://127.0.0.1:8080/a?b=1"
    assert url == expected
    assert target_of(url) == host_of(url)
    assert dedupe_key("default", url) == dedupe_key("default", canonicalize(expected))
    policy = AddressPolicy.of(allow_private=False)
    assert not policy.allows(host_of(url), host_of(url))


@pytest.mark.parametrize("host", ["256.1.1.1", "1.2.3.4.5", "foo.09", "1.2.3.0x100", "09"])
def test_a_host_ending_in_a_number_that_is_no_address_is_refused(host: str) -> None:
    with pytest.raises(InvalidURLError):
        canonicalize(f"http://{host}/")


def test_names_that_merely_contain_digits_stay_names() -> None:
    for host in ("a1.example", "1a.example", "123.example", "example.com", "x.0a", "1.0x1g"):
        assert not ends_in_number(host)
        assert host_of(canonicalize(f"http://{host}/")) == host


def test_site_local_ipv6_is_not_public() -> None:
    assert not address_is_public("fec0::1")
    assert not address_is_public("feff:ffff::1")
    assert address_is_public("2606:4700::1111")


def test_no_url_canonical_before_has_a_new_key_or_target() -> None:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    assert len(rows) >= 3000
    checked = 0
    for row in rows:
        if "error" in row:
            with pytest.raises(InvalidURLError):
                canonicalize(row["raw"])
            continue
        before = row["canonical"]
        if ends_in_number(host_of(before)) and not host_of(before).replace(".", "").isdigit():
            continue  # never emitted before: numeric spellings are the change itself
        assert canonicalize(row["raw"]) == before, row
        assert canonicalize(before) == before, row
        # Domain mode changed on purpose: the Public Suffix List replaced a heuristic
        # (tests/unit/test_registrable_domain.py); and a trailing dot no longer makes a
        # second target (the same site under two caps).
        assert target_of(before) == row["target"].rstrip("."), row
        checked += 1
    assert checked >= 2500


LABELS = st.one_of(st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True),
                   st.integers(0, 300).map(str), st.integers(0, 2**32).map(hex))


@given(st.lists(LABELS, min_size=1, max_size=5), st.integers(1, 65535))
def test_canonical_forms_are_fixed_points(labels: list[str], port: int) -> None:
    try:
        once = canonicalize(f"http://{'.'.join(labels)}:{port}/p")
    except InvalidURLError:
        return
    assert canonicalize(once) == once
    host = host_of(once)
    assert not ends_in_number(host) or host.count(".") == 3  # a number is a dotted quad


@pytest.mark.parametrize("url", ["http://[fe80::1%25eth0]/", "http://[::1%\x80]/",
                                 "http://[fe80::1%eth0]:8080/a"])
def test_an_ipv6_zone_id_is_refused(url: str) -> None:
    with pytest.raises(InvalidURLError):
        canonicalize(url)


def test_a_trailing_dot_names_the_same_target() -> None:
    for mode in ("host", "domain"):
        assert target_of(canonicalize("http://www.example.com./a"), mode) == \
            target_of(canonicalize("http://www.example.com/a"), mode)
    assert target_of("http://www.example.com./a") == "www.example.com"
