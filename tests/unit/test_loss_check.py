"""The independent loss checker's verdict, on hand-made sources with hand-counted answers."""

from __future__ import annotations

from chaos.loss_check import StoreRows, check

A, B, C, D, E = (f"http://127.0.0.2:1/{x}.html" for x in "abcde")
ROBOTS = "http://127.0.0.2:1/nofollow/1.html"


def _store(final: dict[str, int], raw: dict[str, int] | None = None,
           keys: dict[str, int] | None = None, dead: dict[str, tuple[str, ...]] | None = None,
           status: dict[str, int] | None = None) -> StoreRows:
    raw = raw if raw is not None else dict(final)
    return StoreRows(final=final, raw=raw, raw_keys=keys if keys is not None else
                     dict.fromkeys(raw, 1), status=status or dict.fromkeys(final, 200),
                     dead=dead or {})


def test_a_clean_crawl_is_ok() -> None:
    v = check({A: 200, B: 200}, {A: 1, B: 1}, _store({A: 1, B: 1}))
    assert v.ok
    assert v.stored_once == 2 and v.lost == () and v.duplicates == 0
    assert v.request_over_apply == 0 and v.requests_per_url == {1: 2}


def test_a_reachable_url_neither_stored_nor_dead_is_lost() -> None:
    # C was requested (the site answered it) and never stored: lost all the same.
    v = check({A: 200, B: 200, C: 200}, {A: 1, C: 1}, _store({A: 1}))
    assert v.lost == (B, C) and v.lost_count == 2
    assert v.stored_once == 1
    assert not v.ok


def test_a_dead_letter_with_a_reason_accounts_for_a_url() -> None:
    v = check({A: 200, B: 200}, {A: 1, B: 3},
              _store({A: 1}, dead={B: ("server_error",)}))
    assert v.lost == ()
    assert v.dead_lettered == {"server_error": 1}
    assert v.ok
    # B's three attempts are two requests beyond the one the site's script asks for: the
    # checker counts them (a site page that fails on purpose declares it in its spec).
    assert v.request_over_apply == 2


def test_a_dead_letter_without_a_reason_does_not() -> None:
    v = check({A: 200, B: 200}, {A: 1}, _store({A: 1}, dead={B: ("",)}))
    assert v.lost == (B,)
    assert v.dead_without_reason == (B,)
    assert v.dead_lettered == {}


def test_two_rows_in_final_are_duplicates() -> None:
    # FINAL collapses one key; two rows for one URL means two keys (e.g. two profiles).
    v = check({A: 200, B: 200}, {A: 1, B: 1}, _store({A: 2, B: 1}, keys={A: 2, B: 1}))
    assert v.final_duplicates == {A: 1}
    assert v.duplicates == 1
    assert v.stored_once == 1  # A is stored, but not exactly once
    assert v.lost == ()
    assert not v.ok


def test_raw_rows_beyond_one_per_key_are_store_over_apply() -> None:
    # A inserted three times under one key (merges not done yet), B twice, C once.
    v = check({A: 200, B: 200, C: 200}, {A: 1, B: 1, C: 1},
              _store({A: 1, B: 1, C: 1}, raw={A: 3, B: 2, C: 1}))
    assert v.store_over_apply == 3
    assert v.store_over_applied == {A: 2, B: 1}
    assert v.duplicates == 0 and v.ok  # FINAL is right: over-apply alone is not loss


def test_unreachable_but_stored_fails_the_verdict() -> None:
    v = check({A: 200}, {A: 1, D: 1}, _store({A: 1, D: 1}))
    assert v.unreachable_stored == (D,)
    assert v.unreachable_requested == (D,)
    assert v.lost == ()
    assert not v.ok


def test_stored_without_any_request_fails_the_verdict() -> None:
    v = check({A: 200, B: 200}, {A: 1}, _store({A: 1, B: 1}))
    assert v.stored_unrequested == (B,)
    assert not v.ok


def test_robots_dead_letters_of_unreachable_urls_are_reported_apart() -> None:
    v = check({A: 200}, {A: 1}, _store({A: 1}, dead={ROBOTS: ("robots_disallowed",)}))
    assert v.unreachable_dead == {"robots_disallowed": 1}
    assert v.dead_lettered == {}
    assert v.ok


def test_requests_beyond_need_per_url() -> None:
    # A needs 3 (two scripted 503s first) and got 3; B got 4 (3 beyond); C got 2 (1 beyond).
    v = check({A: 200, B: 200, C: 200, E: 404}, {A: 3, B: 4, C: 2, E: 1},
              _store({A: 1, B: 1, C: 1, E: 1}, status={A: 200, B: 200, C: 200, E: 404}),
              needed_requests={A: 3})
    assert v.request_over_apply == 4
    assert v.most_requested == ((B, 3), (C, 1))
    assert v.requests_per_url == {1: 1, 2: 1, 3: 1, 4: 1}
    assert v.page_requests == 10 and v.requested_urls == 4
    assert v.wrong_status == ()


def test_a_wrong_status_is_listed() -> None:
    v = check({A: 200, E: 404}, {A: 1, E: 1}, _store({A: 1, E: 1}, status={A: 200, E: 200}))
    assert v.wrong_status == ((E, 404, 200),)


def test_stored_and_dead_is_listed_and_counts_as_stored() -> None:
    v = check({A: 200}, {A: 2}, _store({A: 1}, dead={A: ("server_error",)}))
    assert v.stored_and_dead == (A,)
    assert v.dead_lettered == {}
    assert v.lost == () and v.ok
