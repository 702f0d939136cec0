"""A revisit's dedupe key (issue 45): the visit number is part of it, so the seen store
never suppresses a due revisit and never lets one visit be stored twice."""

from __future__ import annotations

from typing import Any

from schemas.keys import REPLAY_META, job_dedupe_key, page_key

URL = "https://example.com/a"


def _job(**over: Any) -> dict[str, Any]:
    return {"url": URL, "target": "example.com", "profile": "desk", "pinned": True,
            "meta": {}, "kind": "page", "visit": 0, "validators": {}, **over}


def test_a_first_visit_keeps_the_key_pages_always_had() -> None:
    assert job_dedupe_key(_job()) == f"desk|{URL}"
    # a job written before v4 has no visit: the same key
    old = {k: v for k, v in _job().items() if k not in ("kind", "visit", "validators")}
    assert job_dedupe_key(old) == f"desk|{URL}"


def test_each_visit_has_a_key_of_its_own() -> None:
    keys = [job_dedupe_key(_job(visit=n)) for n in range(4)]
    assert keys == [f"desk|{URL}", f"desk|{URL} visit:1", f"desk|{URL} visit:2",
                    f"desk|{URL} visit:3"]
    # the same visit twice (a revisit timer fired again after a restart) is one key
    assert job_dedupe_key(_job(visit=2)) == job_dedupe_key(_job(visit=2, attempt=3))


def test_the_page_key_is_the_same_for_every_visit() -> None:
    """The store keeps each page's latest version under its page key."""
    assert {page_key(_job(visit=n)) for n in range(3)} == {f"desk|{URL}"}


def test_a_replayed_revisit_carries_both() -> None:
    job = _job(visit=2, pinned=False, meta={REPLAY_META: "r1"})
    assert job_dedupe_key(job) == f"*|{URL} visit:2 replay:r1"
