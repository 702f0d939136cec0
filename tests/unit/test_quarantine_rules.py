"""The quarantine app's counting (streams.quarantine_rules): pure, no broker, no faust."""

from __future__ import annotations

import pytest

from core.config import Settings
from core.errors import ConfigError, DecodeError
from schemas.records import QuarantineCounts
from streams.control import quarantine_key
from streams.quarantine_rules import Block, Issued, Rules, active, empty, is_empty, observe

W = 600_000
RULES = Rules(blocks=3, window_ms=W, quarantine_ms=1_800_000, target_share=0.5)
PROFILES = ("alpha", "beta", "gamma")
T0 = 1_000_000_000


def feed(blocks: list[Block], rules: Rules = RULES,
         allowed: tuple[str, ...] = PROFILES,
         pools: dict[str, tuple[str, ...]] | None = None) -> list[Issued]:
    states: dict[str, QuarantineCounts] = {}  # one per target, as the app's table keeps
    out: list[Issued] = []
    for b in blocks:
        out += observe(states.setdefault(b.target, empty(b.target)), b, rules, allowed, pools)
    return out


def blk(eid: str, at_s: float, profile: str = "alpha", egress: str = "direct",
        target: str = "t") -> Block:
    return Block(eid, target, profile, egress, T0 + int(at_s * 1000))


def keys(issued: list[Issued]) -> list[str]:
    return [quarantine_key(i.quarantine.scope, i.quarantine.target, i.quarantine.name)
            for i in issued]


def test_exactly_n_blocks_within_the_window_trigger() -> None:
    # Three profiles' worth of egresses, so only the profile's count reaches 3.
    out = feed([blk("1", 0, egress="e1"), blk("2", 100, egress="e2"),
                blk("3", 200, egress="e3")])
    assert keys(out) == ["quarantine:profile:t|alpha"]
    (q,) = out
    assert q.at_ms == T0 + 200_000 and q.quarantine.until_ms == T0 + 200_000 + 1_800_000
    assert q.blocks == 3 and q.event_id == "3" and not q.second_order


def test_n_minus_one_blocks_do_not() -> None:
    assert feed([blk("1", 0, egress="e1"), blk("2", 100, egress="e2")]) == []


def test_blocks_older_than_the_window_fall_out() -> None:
    # 0 s and 300 s, then 601 s: the first is more than W before the third.
    assert feed([blk("1", 0, egress="e1"), blk("2", 300, egress="e2"),
                 blk("3", 601, egress="e3")]) == []
    # ... while three within W of the newest do trigger.
    out = feed([blk("1", 0, egress="e1"), blk("2", 300, egress="e2"),
                blk("3", 599, egress="e3")])
    assert keys(out) == ["quarantine:profile:t|alpha"]


def test_duplicate_ids_never_count_twice() -> None:
    twice = [blk("1", 0, egress="e1"), blk("2", 10, egress="e2")] * 3
    assert feed(twice) == []
    # Replaying the triggering events after the quarantine issues nothing again.
    state = empty("t")
    first = [blk("1", 0), blk("2", 10), blk("3", 20)]
    issued = [i for b in first for i in observe(state, b, RULES, PROFILES)]
    assert len(issued) == 2  # the profile and its egress (direct), from the same event
    assert [i for b in first for i in observe(state, b, RULES, PROFILES)] == []


def test_a_repeat_while_active_is_not_issued_again_but_after_it_is() -> None:
    rules = Rules(blocks=2, window_ms=W, quarantine_ms=60_000)
    out = feed([blk("1", 0, egress="e1"), blk("2", 1, egress="e2"),
                blk("3", 2, egress="e3"), blk("4", 3, egress="e4"),  # active: nothing
                blk("5", 100, egress="e5")], rules, ())  # over at 61 s: 3, 4, 5 count
    assert [(i.quarantine.name, i.at_ms - T0) for i in out] == [("alpha", 1000),
                                                               ("alpha", 100_000)]
    # The blocks that triggered one quarantine never count toward the next.
    out = feed([blk("1", 0, egress="e1"), blk("2", 1, egress="e2"),
                blk("5", 100, egress="e5"), blk("6", 101, egress="e6")], rules, ())
    assert [i.at_ms - T0 for i in out] == [1000, 101_000]


def test_egress_is_counted_apart_from_profiles() -> None:
    out = feed([blk("1", 0, "alpha", "px"), blk("2", 1, "beta", "px"),
                blk("3", 2, "gamma", "px")])
    assert keys(out) == ["quarantine:egress:t|px"]


def test_targets_are_counted_apart() -> None:
    out = feed([blk("1", 0, target="a", egress="e1"), blk("2", 1, target="b", egress="e2"),
                blk("3", 2, target="a", egress="e3")])
    assert out == []


def test_target_pause_when_most_profiles_are_quarantined() -> None:
    profile_a = [blk(f"a{i}", i, "alpha", f"a{i}") for i in range(3)]
    profile_b = [blk(f"b{i}", 10 + i, "beta", f"b{i}") for i in range(3)]
    out = feed(profile_a + profile_b)
    assert keys(out) == ["quarantine:profile:t|alpha", "quarantine:profile:t|beta",
                         "quarantine:target:t|"]
    pause = out[-1]
    assert pause.quarantine.until_ms == T0 + 12_000 + 1_800_000
    assert "2 of 3 profiles" in pause.quarantine.reason
    # One of three is not "most": no pause. With one profile allowed, one is.
    assert keys(feed(profile_a)) == ["quarantine:profile:t|alpha"]
    assert keys(feed(profile_a, allowed=("alpha",))) == ["quarantine:profile:t|alpha",
                                                         "quarantine:target:t|"]
    # Profiles not allowed for the target do not count toward its pause.
    assert "quarantine:target:t|" not in keys(feed(profile_a + profile_b,
                                                   allowed=("alpha", "gamma", "delta")))


def test_second_order_is_a_neighbour_of_the_same_kind_within_the_window() -> None:
    a = [blk(f"a{i}", i, "alpha", f"a{i}") for i in range(3)]
    b_soon = [blk(f"b{i}", 100 + i, "beta", f"b{i}") for i in range(3)]
    out = feed(a + b_soon, allowed=("alpha", "beta", "gamma", "delta"))
    assert [(i.quarantine.name, i.second_order) for i in out] == [("alpha", False),
                                                                   ("beta", True)]
    b_late = [blk(f"b{i}", 700 + i, "beta", f"b{i}") for i in range(3)]
    out = feed(a + b_late, allowed=("alpha", "beta", "gamma", "delta"))
    assert [(i.quarantine.name, i.second_order) for i in out] == [("alpha", False),
                                                                   ("beta", False)]
    # A profile and an egress quarantined by the same block are not each other's cascade.
    out = feed([blk("1", 0), blk("2", 1), blk("3", 2)])
    assert [(i.quarantine.scope, i.second_order) for i in out] == [("profile", False),
                                                                   ("egress", False)]


def test_state_stays_bounded_and_empties() -> None:
    state = empty("t")
    for i in range(500):  # a site blocking everything, one block a second
        observe(state, blk(str(i), i, egress=f"e{i % 7}"), RULES, PROFILES)
    assert all(len(ids) <= RULES.keep for ids in state["windows"].values())
    assert active(state, T0 + 500_000) >= 1
    later = T0 + 500_000 + RULES.quarantine_ms + W
    observe(state, Block("last", "t", "", "", later), RULES, PROFILES)
    assert is_empty(state)


@pytest.mark.parametrize(("field", "value"), [("quarantine_blocks", 0),
                                              ("quarantine_window_s", 0),
                                              ("quarantine_s", -1),
                                              ("quarantine_target_share", 1.0)])
def test_quarantine_settings_are_validated(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        Settings(**{field: value})


def test_table_values_round_trip_with_their_schema() -> None:
    from streams.quarantine import decode_counts, encode_counts  # imports faust
    state = empty("t")
    for b in (blk("1", 0), blk("2", 1), blk("3", 2)):
        observe(state, b, RULES, PROFILES)
    raw = encode_counts(state)
    assert raw[:2] == b"\xc3\x01"  # single-object encoding: the schema travels with it
    assert decode_counts(raw) == state
    with pytest.raises(DecodeError):
        decode_counts(b"{}")


ONE_EGRESS = {p: ("direct",) for p in PROFILES}
TWO_EGRESSES = {p: ("px1", "px2") for p in PROFILES}


def test_one_profile_banned_on_a_shared_egress_retires_the_profile_not_the_egress() -> None:
    out = feed([blk(str(i), i, profile="beta") for i in range(5)], pools=ONE_EGRESS)
    assert keys(out) == [quarantine_key("profile", "t", "beta")]


def test_an_egress_several_profiles_use_is_blamed_once_two_of_them_are_refused() -> None:
    out = feed([blk("1", 0, "alpha", "direct"), blk("2", 1, "alpha", "direct")],
               pools=ONE_EGRESS, rules=Rules(blocks=2, window_ms=W))
    assert keys(out) == [quarantine_key("profile", "t", "alpha")]  # not yet the egress
    out = feed([blk("1", 0, "alpha", "direct"), blk("2", 1, "beta", "direct")],
               pools=ONE_EGRESS, rules=Rules(blocks=2, window_ms=W))
    # (the only egress retired: no profile has a way out, so the target pauses with it)
    assert keys(out) == [quarantine_key("egress", "t", "direct"),
                         quarantine_key("target", "t", "")]


def test_a_banned_egress_retires_the_egress_not_the_profiles_that_used_it() -> None:
    blocks = [blk(str(i), i, PROFILES[i % 3], "px2") for i in range(6)]
    out = feed(blocks, pools=TWO_EGRESSES)
    assert keys(out) == [quarantine_key("egress", "t", "px2")]
    # A profile refused through both of its egresses is the profile's own doing.
    out = feed([blk("a", 0, "beta", "px1"), blk("b", 1, "beta", "px2"),
                blk("c", 2, "beta", "px1")], pools=TWO_EGRESSES)
    assert quarantine_key("profile", "t", "beta") in keys(out)


def test_a_sole_profile_or_a_sole_egress_takes_the_blame_alone() -> None:
    pools = {"alpha": ("px1", "px2")}  # one profile: a banned egress can only be px2's fault
    out = feed([blk(str(i), i, "alpha", "px2") for i in range(3)], allowed=("alpha",),
               pools=pools)
    assert keys(out) == [quarantine_key("egress", "t", "px2")]


def test_a_site_refusing_every_profile_through_the_only_egress_pauses_the_target() -> None:
    # Three profiles on one egress, each refused once: the egress takes the blame, which
    # leaves every profile without a way out, so the target pauses (it is not left waiting
    # with nothing said).
    out = feed([blk("1", 0, "alpha"), blk("2", 1, "beta"), blk("3", 2, "gamma")],
               pools=ONE_EGRESS)
    assert keys(out) == [quarantine_key("egress", "t", "direct"),
                         quarantine_key("target", "t", "")]
    assert not any(i.second_order for i in out)
