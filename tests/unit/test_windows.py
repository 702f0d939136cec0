"""Per-target crawl windows in the target's local time, including DST transitions.

2026 transitions used below (all Sundays):
Europe/Paris      2026-03-29 01:00 UTC (02:00 CET -> 03:00 CEST),
                  2026-10-25 01:00 UTC (03:00 CEST -> 02:00 CET);
America/New_York  2026-03-08 07:00 UTC (02:00 EST -> 03:00 EDT),
                  2026-11-01 06:00 UTC (02:00 EDT -> 01:00 EST).
2026-06-10 is a Wednesday, 2026-06-12 a Friday, 2026-06-15 a Monday.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, time
from zoneinfo import ZoneInfo

import pytest

from core.errors import ConfigError
from core.windows import CrawlWindow, parse_windows, seconds_until_open

H = 3600


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=UTC)


def wait(spec: str, now: datetime) -> float:
    return seconds_until_open(parse_windows(spec), now)


# --- parsing -----------------------------------------------------------------------------


def test_parse_simple_window_defaults_to_every_day() -> None:
    assert parse_windows("Europe/Paris 09:00-17:00") == (
        CrawlWindow(ZoneInfo("Europe/Paris"), time(9, 0), time(17, 0), frozenset(range(7))),
    )


@pytest.mark.parametrize(
    ("days", "expected"),
    [
        ("mon-fri", {0, 1, 2, 3, 4}),
        ("sat,sun", {5, 6}),
        ("mon,wed-fri", {0, 2, 3, 4}),
        ("Mon-Fri", {0, 1, 2, 3, 4}),
        ("fri-mon", {4, 5, 6, 0}),  # ranges wrap around the week
        ("sun", {6}),
        ("mon-sun", set(range(7))),
    ],
)
def test_parse_days(days: str, expected: set[int]) -> None:
    (window,) = parse_windows(f"America/New_York {days} 22:00-06:00")
    assert window.days == frozenset(expected)
    assert window.start == time(22, 0)
    assert window.end == time(6, 0)


def test_parse_several_windows_with_loose_whitespace() -> None:
    windows = parse_windows("  Europe/Paris 09:00-12:00 ;Asia/Tokyo  sat  9:30-10:00  ")
    assert [(w.tz.key, w.start, w.end, w.days) for w in windows] == [
        ("Europe/Paris", time(9), time(12), frozenset(range(7))),
        ("Asia/Tokyo", time(9, 30), time(10), frozenset({5})),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("Europe/Paris 09:00-17:00;", "empty part"),
        ("Europe/Paris 09:00-17:00;;UTC 01:00-02:00", "empty part"),
        ("Mars/Olympus 09:00-17:00", "unknown time zone 'Mars/Olympus'"),
        ("Europe 09:00-17:00", "unknown time zone 'Europe'"),
        ("../etc/passwd 09:00-17:00", "unknown time zone '../etc/passwd'"),
        ("UTC 09:00-10:00; Mars/Olympus 09:00-17:00", "'Mars/Olympus 09:00-17:00'"),
        ("Europe/Paris 25:00-26:00", "bad time '25:00'"),
        ("Europe/Paris 09:60-17:00", "bad time '09:60'"),
        ("Europe/Paris 9-17", "bad time '9'"),
        ("Europe/Paris 09:00-17:00-18:00", "bad time '17:00-18:00'"),
        ("Europe/Paris \u0660\u0669:00-17:00", "bad time"),  # non-ASCII digits
        ("Europe/Paris 09:00", "bad time range '09:00'"),
        ("Europe/Paris xyz 09:00-17:00", "bad day 'xyz'"),
        ("Europe/Paris mon- 09:00-17:00", "bad day 'mon-'"),
        ("Europe/Paris mon,,fri 09:00-17:00", "bad day ''"),
        ("Europe/Paris monday 09:00-17:00", "bad day 'monday'"),
        ("Europe/Paris", "expected '<zone> [days] HH:MM-HH:MM'"),
        ("Europe/Paris mon 09:00-10:00 extra", "expected '<zone> [days] HH:MM-HH:MM'"),
    ],
)
def test_bad_specs_raise_config_error_naming_the_part(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_windows(spec)


# --- plain windows (June: Paris is UTC+2, New York UTC-4) --------------------------------


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 6, 10, 10), 0.0),  # 12:00 local: inside
        (utc(2026, 6, 10, 7), 0.0),  # 09:00 local: start is inclusive
        (utc(2026, 6, 10, 6), 1 * H),  # 08:00 local
        (utc(2026, 6, 10, 6, 59, 59, 250_000), 0.75),
        (utc(2026, 6, 10, 15), 16 * H),  # 17:00 local: end is exclusive, next is tomorrow
        (utc(2026, 6, 10, 21, 30), 9.5 * H),  # 23:30 local
    ],
)
def test_inside_and_outside_a_daytime_window(now: datetime, expected: float) -> None:
    assert wait("Europe/Paris 09:00-17:00", now) == expected


def test_now_in_another_zone_is_treated_as_an_instant() -> None:
    paris = ZoneInfo("Europe/Paris")
    assert wait("Europe/Paris 09:00-17:00", datetime(2026, 6, 10, 8, 30, tzinfo=paris)) == 1800
    assert wait("Europe/Paris 09:00-17:00", datetime(2026, 6, 10, 9, 30, tzinfo=paris)) == 0.0


def test_naive_now_is_rejected() -> None:
    with pytest.raises(ValueError, match="aware"):
        wait("UTC 09:00-10:00", datetime(2026, 6, 10, 9, 30))


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 6, 10, 5), 0.0),  # 01:00 local, window opened yesterday 22:00
        (utc(2026, 6, 10, 2), 0.0),  # 22:00 local
        (utc(2026, 6, 10, 10), 16 * H),  # 06:00 local: closed, opens 22:00
        (utc(2026, 6, 10, 12), 14 * H),  # 08:00 local
    ],
)
def test_window_crossing_midnight(now: datetime, expected: float) -> None:
    assert wait("America/New_York 22:00-06:00", now) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 6, 13, 6), 0.0),  # Sat 02:00: Friday's 22:00 window is still open
        (utc(2026, 6, 13, 12), 62 * H),  # Sat 08:00 -> Mon 22:00
        (utc(2026, 6, 14, 3), 47 * H),  # Sat 23:00: Saturday is no start day
        (utc(2026, 6, 15, 6), 20 * H),  # Mon 02:00: Sunday started none
        (utc(2026, 6, 16, 6), 0.0),  # Tue 02:00: Monday's window
    ],
)
def test_day_filter_applies_to_start_day(now: datetime, expected: float) -> None:
    assert wait("America/New_York mon-fri 22:00-06:00", now) == expected


def test_several_windows_are_a_union() -> None:
    spec = "Europe/Paris 09:00-12:00; Europe/Paris 14:00-17:00"
    assert wait(spec, utc(2026, 6, 10, 10, 30)) == 1.5 * H  # 12:30 local
    assert wait(spec, utc(2026, 6, 10, 13)) == 0.0  # 15:00 local
    assert wait(spec, utc(2026, 6, 10, 8)) == 0.0  # 10:00 local


def test_several_zones_pick_the_earliest_opening() -> None:
    spec = "Asia/Tokyo 09:00-10:00; Europe/London 09:00-10:00"  # 00:00 and 08:00 UTC
    assert wait(spec, utc(2026, 6, 10, 1)) == 7 * H
    assert wait(spec, utc(2026, 6, 10, 9)) == 15 * H
    assert wait(spec, utc(2026, 6, 10, 0, 30)) == 0.0


def test_start_equal_end_is_a_24_hour_window() -> None:
    spec = "UTC mon 00:00-00:00"
    assert wait(spec, utc(2026, 6, 15, 0)) == 0.0
    assert wait(spec, utc(2026, 6, 15, 23, 59)) == 0.0
    assert wait(spec, utc(2026, 6, 16, 0)) == 6 * 24 * H
    assert wait(spec, utc(2026, 6, 14, 23)) == 1 * H


def test_no_windows_means_always_open() -> None:
    assert seconds_until_open((), utc(2026, 6, 10, 3)) == 0.0
    assert seconds_until_open([], utc(2026, 6, 10, 3)) == 0.0


def test_window_with_no_days_never_opens() -> None:
    window = CrawlWindow(ZoneInfo("UTC"), time(9), time(10), frozenset())
    assert seconds_until_open([window], utc(2026, 6, 10, 3)) == math.inf


# --- DST: Europe/Paris -------------------------------------------------------------------


def test_paris_spring_forward_next_day_opening_uses_new_offset() -> None:
    # Sat 17:00 CET -> Sun 09:00 CEST is 15 real hours, not 16.
    assert wait("Europe/Paris 09:00-17:00", utc(2026, 3, 28, 16)) == 15 * H


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 3, 29, 0, 30), 0.5 * H),  # 01:30 CET; 02:30 does not exist -> 03:00 CEST
        (utc(2026, 3, 29, 1), 0.0),  # 03:00 CEST: the transition instant opens it
        (utc(2026, 3, 29, 1, 59), 0.0),
        (utc(2026, 3, 29, 2), 22.5 * H),  # 04:00 CEST closes; next 02:30 CEST on Monday
    ],
)
def test_paris_spring_forward_opening_in_gap(now: datetime, expected: float) -> None:
    assert wait("Europe/Paris 02:30-04:00", now) == expected


def test_paris_window_wholly_inside_gap_does_not_open_that_day() -> None:
    spec = "Europe/Paris 02:00-02:30"
    assert wait(spec, utc(2026, 3, 29, 0, 30)) == 23.5 * H  # Mon 02:00 CEST = 00:00 UTC
    assert wait(spec, utc(2026, 3, 29, 1)) == 23 * H


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 3, 28, 20, 30), 0.5 * H),  # Sat 21:30 CET
        (utc(2026, 3, 29, 3, 59), 0.0),  # Sun 05:59 CEST: 7 real hours after opening
        (utc(2026, 3, 29, 4), 16 * H),  # Sun 06:00 CEST -> Sun 22:00 CEST
    ],
)
def test_paris_overnight_window_across_spring_forward(now: datetime, expected: float) -> None:
    assert wait("Europe/Paris 22:00-06:00", now) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 10, 24, 23, 30), 0.5 * H),  # 01:30 CEST
        (utc(2026, 10, 25, 0), 0.0),  # first 02:00 (CEST) opens it
        (utc(2026, 10, 25, 1, 30), 0.0),  # second-pass 02:30 CET: still open
        (utc(2026, 10, 25, 2), 23 * H),  # 03:00 CET closes; next 02:00 CET = 01:00 UTC
    ],
)
def test_paris_fall_back_window_over_repeated_hour(now: datetime, expected: float) -> None:
    assert wait("Europe/Paris 02:00-03:00", now) == expected


def test_paris_fall_back_window_inside_fold_uses_first_occurrence() -> None:
    spec = "Europe/Paris 02:15-02:45"  # Oct 25: 00:15-00:45 UTC, i.e. CEST
    assert wait(spec, utc(2026, 10, 25, 0)) == 0.25 * H
    assert wait(spec, utc(2026, 10, 25, 0, 30)) == 0.0
    # 02:30 CET on the second pass is not reopened: next is Mon 02:15 CET = 01:15 UTC.
    assert wait(spec, utc(2026, 10, 25, 1, 30)) == 23.75 * H


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 10, 24, 19), 1 * H),  # Sat 21:00 CEST
        (utc(2026, 10, 25, 4, 59), 0.0),  # Sun 05:59 CET: 9 real hours after opening
        (utc(2026, 10, 25, 5), 16 * H),  # Sun 06:00 CET -> Sun 22:00 CET
    ],
)
def test_paris_overnight_window_across_fall_back(now: datetime, expected: float) -> None:
    assert wait("Europe/Paris 22:00-06:00", now) == expected


# --- DST: America/New_York ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 3, 8, 6), 1 * H),  # 01:00 EST; 02:30 does not exist -> 03:00 EDT
        (utc(2026, 3, 8, 7), 0.0),
        (utc(2026, 3, 8, 9), 21.5 * H),  # 05:00 EDT closes; next Mon 02:30 EDT
    ],
)
def test_new_york_spring_forward_opening_in_gap(now: datetime, expected: float) -> None:
    assert wait("America/New_York 02:30-05:00", now) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 3, 8, 2), 1 * H),  # Sat 21:00 EST
        (utc(2026, 3, 8, 9, 59, 59), 0.0),  # Sun 05:59:59 EDT
        (utc(2026, 3, 8, 10), 16 * H),  # Sun 06:00 EDT -> Sun 22:00 EDT
    ],
)
def test_new_york_overnight_window_across_spring_forward(now: datetime, expected: float) -> None:
    assert wait("America/New_York 22:00-06:00", now) == expected


def test_new_york_24_hour_window_on_spring_forward_day_lasts_23_hours() -> None:
    spec = "America/New_York sun 00:00-00:00"  # Mar 8 05:00 UTC to Mar 9 04:00 UTC
    assert wait(spec, utc(2026, 3, 8, 4)) == 1 * H
    assert wait(spec, utc(2026, 3, 9, 3, 59)) == 0.0
    assert wait(spec, utc(2026, 3, 9, 4)) == 6 * 24 * H  # next Sunday 00:00 EDT


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 11, 1, 5), 0.5 * H),  # 01:00 EDT; opens at the first 01:30 (EDT)
        (utc(2026, 11, 1, 6, 15), 0.0),  # 01:15 EST on the second pass: already open
        (utc(2026, 11, 1, 8), 22.5 * H),  # 03:00 EST closes; next Mon 01:30 EST
    ],
)
def test_new_york_fall_back_opening_in_fold(now: datetime, expected: float) -> None:
    assert wait("America/New_York 01:30-03:00", now) == expected


def test_new_york_window_inside_fold_opens_once() -> None:
    spec = "America/New_York 01:00-01:30"  # Nov 1: 05:00-05:30 UTC (EDT)
    assert wait(spec, utc(2026, 11, 1, 5, 10)) == 0.0
    # 01:10 EST on the second pass: closed until Mon 01:00 EST = 06:00 UTC.
    assert wait(spec, utc(2026, 11, 1, 6, 10)) == 23 * H + 50 * 60
