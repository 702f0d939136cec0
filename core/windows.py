"""Per-target crawl windows, in the target's own local time: pure logic.

Sites ask to be crawled off-peak in *their* time zone, so a window is a wall-clock span
(``"Europe/Paris 09:00-17:00"``) that must follow the zone's DST rules rather than a fixed
UTC offset.

Spec grammar (whitespace-separated, several windows joined by ``;`` form a union)::

    <IANA zone> [days] HH:MM-HH:MM

``days`` is a comma-separated list of ``mon`` .. ``sun`` names or ``a-b`` ranges (ranges may
wrap around the week: ``fri-mon``); it names the days on which a window STARTS, and defaults
to every day. ``end <= start`` means the window crosses midnight; ``start == end`` is a
24-hour window.

Every boundary is resolved with one rule: it is the earliest instant at which the zone's
wall clock reads that time or later, on that date. Hence:

* spring-forward gap: a boundary at a non-existent time (02:30 in a 02:00->03:00 gap) falls
  on the first existing instant after it, the transition itself (03:00 new time); a window
  lying wholly inside the gap is empty that day and never opens;
* fall-back fold: a boundary at a repeated time falls on its first occurrence, so a window
  opens and closes once per start day, the first time the clock strikes each boundary.

Windows are then plain UTC instant intervals ``[open, close)``, so their real length varies
by an hour across a transition, as the wall clock says it should.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import ConfigError

__all__ = ["CrawlWindow", "parse_windows", "seconds_until_open"]

_DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_ALL_DAYS = frozenset(range(7))
_TIME_RE = re.compile(r"([0-9]{1,2}):([0-9]{2})")
#: how far ahead ``seconds_until_open`` looks; a week plus slack covers any day filter
_HORIZON = timedelta(days=8)
_FORMAT = "expected '<zone> [days] HH:MM-HH:MM'"


@dataclass(frozen=True)
class CrawlWindow:
    """One daily window in local wall time of ``tz``; ``days`` are start weekdays, 0=Mon."""

    tz: ZoneInfo
    start: time
    end: time
    days: frozenset[int]


def parse_windows(spec: str) -> tuple[CrawlWindow, ...]:
    """Parse a ``;``-separated union of window specs; raise ``ConfigError`` naming the bad part.

    An empty spec is an error rather than "always open": a configured but blank window is
    more likely a mistake than a wish, and "no windows" is expressed by not configuring any.
    """
    if not spec.strip():
        raise ConfigError("crawl window spec is empty; " + _FORMAT)
    return tuple(_parse_one(part.strip(), spec) for part in spec.split(";"))


def _parse_one(part: str, spec: str) -> CrawlWindow:
    if not part:
        raise ConfigError(f"crawl window spec {spec!r} has an empty part between ';'")
    tokens = part.split()
    if len(tokens) == 2:
        zone_name, range_text = tokens
        days = _ALL_DAYS
    elif len(tokens) == 3:
        zone_name, days_text, range_text = tokens
        days = _parse_days(days_text, part)
    else:
        raise ConfigError(f"crawl window {part!r}: {_FORMAT}")
    tz = _parse_zone(zone_name, part)
    start_text, sep, end_text = range_text.partition("-")
    if not sep:
        raise ConfigError(f"crawl window {part!r}: bad time range {range_text!r}, {_FORMAT}")
    return CrawlWindow(tz=tz, start=_parse_time(start_text, part),
                       end=_parse_time(end_text, part), days=days)


def _parse_zone(name: str, part: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError/OSError: malformed keys ("../x", "/abs") and directories ("Europe")
        raise ConfigError(f"crawl window {part!r}: unknown time zone {name!r}") from None


def _parse_time(text: str, part: str) -> time:
    match = _TIME_RE.fullmatch(text)
    if match is None or int(match[1]) > 23 or int(match[2]) > 59:
        raise ConfigError(f"crawl window {part!r}: bad time {text!r}, expected HH:MM 00:00-23:59")
    return time(int(match[1]), int(match[2]))


def _parse_days(text: str, part: str) -> frozenset[int]:
    days: set[int] = set()
    for item in text.lower().split(","):
        first, sep, last = item.partition("-")
        if first not in _DAY_NAMES or (sep and last not in _DAY_NAMES):
            raise ConfigError(f"crawl window {part!r}: bad day {item!r}, "
                              f"expected names from {'/'.join(_DAY_NAMES)} or a range like mon-fri")
        lo = _DAY_NAMES.index(first)
        hi = _DAY_NAMES.index(last) if sep else lo
        days.update((lo + i) % 7 for i in range((hi - lo) % 7 + 1))  # ranges wrap the week
    return frozenset(days)


def _instant(tz: ZoneInfo, day: date, at: time) -> datetime:
    """Earliest UTC instant at which ``tz``'s wall clock reads ``day at`` or later."""
    wall = datetime.combine(day, at)
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    existing = [u for u in (first, second) if _wall(u, tz) == wall]
    if existing:
        return min(existing)  # in a fold: the first occurrence
    # In a gap: the two folds straddle the transition, where the clock jumps past ``wall``;
    # bisect on whole seconds for the first instant whose wall time is at or after it.
    lo, hi = int(min(first, second).timestamp()), int(max(first, second).timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(datetime.fromtimestamp(mid, UTC), tz) >= wall:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def _wall(instant: datetime, tz: ZoneInfo) -> datetime:
    """Naive local wall time of ``instant`` (naive so comparisons ignore ``fold``)."""
    return instant.astimezone(tz).replace(tzinfo=None)


def seconds_until_open(windows: Sequence[CrawlWindow], now: datetime) -> float:
    """Seconds from ``now`` until any window is open: 0.0 if one is open now.

    No windows means no restriction, hence 0.0. Openings are looked for at most 8 days
    ahead; ``math.inf`` means none was found (only possible with an empty ``days`` set).
    ``now`` must be aware; it is compared as a UTC instant, never as wall time.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("seconds_until_open needs an aware datetime, got a naive one")
    if not windows:
        return 0.0
    now = now.astimezone(UTC)
    horizon = now + _HORIZON
    best = math.inf
    for window in windows:
        today = now.astimezone(window.tz).date()
        # Start one day back: a window opened yesterday may still be open (it lasts <= 25 h).
        for offset in range(-1, _HORIZON.days + 1):
            day = today + timedelta(days=offset)
            if day.weekday() not in window.days:
                continue
            opens = _instant(window.tz, day, window.start)
            end_day = day if window.end > window.start else day + timedelta(days=1)
            closes = _instant(window.tz, end_day, window.end)
            if closes <= opens:
                continue  # wholly inside a spring-forward gap: no window that day
            if opens <= now < closes:
                return 0.0
            if now < opens <= horizon:
                best = min(best, (opens - now).total_seconds())
                break  # later days of this window only open later
    return best
