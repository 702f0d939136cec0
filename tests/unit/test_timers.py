"""Timers on broker time: the runtime's key layout and a broker clock that is never early,
and the retry stage's rules on them (due times, the timer id of a tier record)."""

from __future__ import annotations

import random

import pytest

from consumers.retry import due_ms, is_due, parse_id, timer_id
from streams import timers
from streams.state_store import META
from streams.timers import BrokerClock


def key_of(due: int, tier: int, offset: int) -> bytes:
    """A retry timer's key: due time, then the input record's tier and offset."""
    return timers.timer_key(due, timer_id(tier, offset))


def parsed(key: bytes) -> tuple[int, int, int]:
    due, ident = timers.parse_key(key)
    return (due, *parse_id(ident))


def schedule(append_ms: int, tier: int, tier_delay_ms: int, job_delay_ms: int, offset: int,
             now_ms: int | None) -> bytes | None:
    """What the retry stage does with a tier record: its timer key, or None if due now."""
    due = due_ms(append_ms, tier_delay_ms, job_delay_ms)
    return None if is_due(due, now_ms) else key_of(due, tier, offset)


def test_keys_sort_by_due_time_then_tier_then_offset() -> None:
    rng = random.Random(7)
    triples = {(rng.randrange(0, 1 << 50), rng.randrange(3), rng.randrange(0, 1 << 40))
               for _ in range(5000)}
    triples |= {(1_000, 2, 5), (1_000, 0, 7), (999, 2, 1 << 40), (1_001, 0, 0)}
    keys = [key_of(*t) for t in triples]
    assert [parsed(k) for k in sorted(keys)] == sorted(triples)


def test_key_round_trips_and_stays_clear_of_reserved_keys() -> None:
    key = key_of(1_796_115_128_080, 2, 123_456)
    assert len(key) == 1 + 8 + 1 + 8  # the layout retry's changelog always had
    assert not key.startswith(META)
    assert parsed(key) == (1_796_115_128_080, 2, 123_456)
    assert timers.due_of(key) == 1_796_115_128_080
    assert key_of(0, 0, 0) > META + b"\xff" * 20  # after every reserved key


@pytest.mark.parametrize("bad", [(-1, 0, 0), (0, 256, 0), (0, 0, -1), (1 << 64, 0, 0)])
def test_key_out_of_range_is_refused(bad: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        key_of(*bad)
    with pytest.raises(ValueError):
        timers.timer_key(0, b"")  # an id is required: it makes the key unique


@pytest.mark.parametrize("key", [b"", b"\x01" + b"\x00" * 8, b"\x02" + b"\x00" * 17])
def test_parse_rejects_what_is_not_a_timer_key(key: bytes) -> None:
    with pytest.raises(ValueError):
        timers.parse_key(key)


def test_same_input_gives_the_same_key() -> None:
    """A record replayed after an aborted transaction overwrites its timer, never adds one."""
    a = schedule(10_000, 2, 120_000, 3_600_000, 42, now_ms=10_000)
    b = schedule(10_000, 2, 120_000, 3_600_000, 42, now_ms=11_000)
    assert a == b and a is not None


@pytest.mark.parametrize(("tier_ms", "job_ms", "due"), [
    (2_000, 0, 12_000), (2_000, 2_000, 12_000), (2_000, 15_000, 25_000),
    (120_000, 3_600_000, 3_610_000), (120_000, 20_000, 30_000), (15_000, 5_000, 15_000),
    (2_000, -5, 12_000)])
def test_due_is_append_time_plus_the_jobs_delay_else_the_tiers(tier_ms: int, job_ms: int,
                                                               due: int) -> None:
    assert due_ms(10_000, tier_ms, job_ms) == due


def test_schedule_holds_until_due_and_not_a_millisecond_less() -> None:
    assert schedule(10_000, 0, 2_000, 0, 1, now_ms=11_999) is not None
    assert schedule(10_000, 0, 2_000, 0, 1, now_ms=12_000) is None
    assert schedule(10_000, 0, 2_000, 0, 1, now_ms=None) is not None  # time unknown
    key = schedule(10_000, 1, 15_000, 40_000, 9, now_ms=20_000)
    assert key is not None and parsed(key) == (50_000, 1, 9)


def test_due_keys_take_the_due_prefix_up_to_the_limit() -> None:
    keys = sorted(key_of(d, 0, i) for i, d in enumerate([5, 1, 9, 3, 7, 3]))
    assert [timers.due_of(k) for k in timers.due_keys(keys, 5, 100)] == [1, 3, 3, 5]
    assert [timers.due_of(k) for k in timers.due_keys(keys, 5, 2)] == [1, 3]
    assert timers.due_keys(keys, 0, 100) == []
    assert timers.due_keys(iter(keys), 100, 100) == keys


def test_an_hour_long_timer_first_in_a_tier_does_not_hold_back_a_short_one() -> None:
    """The point of the store: order by due time, not by arrival."""
    hour = schedule(0, 2, 120_000, 3_600_000, 0, now_ms=0)
    short = schedule(50, 2, 120_000, 2_000, 1, now_ms=50)
    assert hour is not None and short is not None
    store = sorted([hour, short])
    assert timers.due_keys(store, 120_050, 10) == [short]


def test_value_round_trips() -> None:
    raw = timers.encode_value(b"0123456789abcdef", b"\x00avro\xff")
    assert timers.decode_value(raw) == (b"0123456789abcdef", b"\x00avro\xff")
    assert timers.decode_value(timers.encode_value(b"f", b"")) == (b"f", b"")


@pytest.mark.parametrize("raw", [b"", b"\x00abc", b"\x10short"])
def test_corrupt_value_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        timers.decode_value(raw)


def test_clock_is_unknown_until_it_sees_a_broker_timestamp() -> None:
    clock = BrokerClock()
    assert not clock.known and clock.now_ms(123) is None
    clock.observe(5_000, 1_000_000_000)
    assert clock.known


def test_clock_is_exact_for_a_record_received_at_once_without_drift() -> None:
    clock = BrokerClock(drift_ppm=0)
    clock.observe(1_796_115_128_080, 50_000_000_000)
    assert clock.now_ms(50_000_000_000) == 1_796_115_128_080
    assert clock.now_ms(52_500_000_000) == 1_796_115_130_580
    # A late-received (older) record does not pull the estimate back, or forward.
    assert not clock.observe(1_796_115_128_000, 51_000_000_000)
    assert clock.now_ms(52_500_000_000) == 1_796_115_130_580


def test_fresh_records_tighten_a_late_estimate() -> None:
    clock = BrokerClock(drift_ppm=0)
    clock.observe(1_000, 10_000_000_000)  # received 9 s after it was appended, say
    assert clock.now_ms(10_000_000_000) == 1_000
    assert clock.observe(11_000, 11_000_000_000)  # received at once
    assert clock.now_ms(11_000_000_000) == 11_000


def _never_early(rng: random.Random, drift_ppm: int) -> int:
    """One random scenario; returns how late the estimate was at the end (ms)."""
    rate = 1 + rng.uniform(-drift_ppm, drift_ppm) / 1e6  # broker ns per local ns
    offset_ns = rng.randrange(-(10 ** 18), 10 ** 18)  # the clocks have nothing in common
    start_local = rng.randrange(0, 10 ** 15)

    def broker_ms(local_ns: int) -> int:
        return (offset_ns + start_local + int((local_ns - start_local) * rate)) // 1_000_000

    # Records appended over a while, received after random delays (0 up to minutes), and
    # observed in receipt order (so in an order that is not their append order).
    appended = sorted(start_local + rng.randrange(0, 3_600 * 10 ** 9) for _ in range(40))
    received = sorted((t + rng.choice([0, 0, rng.randrange(10 ** 9),
                                       rng.randrange(300 * 10 ** 9)]), broker_ms(t))
                      for t in appended)
    clock = BrokerClock(drift_ppm)
    for t_recv, ts in received:
        clock.observe(ts, t_recv)
        for later in (t_recv, t_recv + rng.randrange(10 ** 9),
                      t_recv + rng.randrange(10 ** 13)):
            est = clock.now_ms(later)
            assert est is not None and est <= broker_ms(later), (est, broker_ms(later))
    end = received[-1][0]
    est = clock.now_ms(end)
    assert est is not None
    return broker_ms(end) - est


@pytest.mark.parametrize("drift_ppm", [0, 1, 100])
def test_clock_never_fires_early_under_arbitrary_receipt_orders(drift_ppm: int) -> None:
    rng = random.Random(drift_ppm)
    lateness = [_never_early(rng, drift_ppm) for _ in range(400)]
    assert min(lateness) >= 0
    # Scenarios with a promptly received record stay tight (within a millisecond plus drift).
    assert sorted(lateness)[len(lateness) // 2] <= 1 + drift_ppm * 3_600 * 2 // 1_000


def test_a_timer_fires_only_once_broker_time_has_reached_it() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        offset_ms = rng.randrange(10 ** 12, 2 * 10 ** 12)  # broker epoch ms vs local ns
        clock = BrokerClock()
        append_local = rng.randrange(10 ** 12, 10 ** 13)
        append_ms = append_local // 1_000_000 + offset_ms
        clock.observe(append_ms, append_local + rng.randrange(2 * 10 ** 9))
        key = schedule(append_ms, 0, 2_000, rng.choice([0, 2_000, 3_600_000]), 1,
                              clock.now_ms(append_local))
        assert key is not None
        for _ in range(5):
            t = append_local + rng.randrange(4 * 10 ** 12)
            now = clock.now_ms(t)
            assert now is not None
            if timers.due_keys([key], now, 1):
                assert t // 1_000_000 + offset_ms >= timers.due_of(key)
