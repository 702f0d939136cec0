"""Revisit policies (issue 45): when a stored page is visited again. Pure: no clock.

A policy is written as text, per target pattern (``fnmatch``: ``"*.example.org"``) with a
default, in the settings (``revisit``, ``revisits``):

- ``once``: never again (today's behaviour, and the default: a one-off crawl is one pass);
- ``every 6h``: a fixed interval after each visit;
- ``adaptive 10m..7d``: by change rate, as StormCrawler's AdaptiveFetchSchedule: the first
  revisit comes ``min`` after the first visit; a visit that found the page changed halves
  the interval, one that found it unchanged (a 304, or the same text) grows it by half,
  always within ``[min, max]``. A page that changes every hour settles near an hour, one
  that never changes drifts to ``max``.

Durations: a number with ``s``, ``m``, ``h``, ``d`` or ``w`` (``90s``, ``15m``, ``6h``).

A sitemap's ``<lastmod>`` (carried by the page's first-visit job, ``schemas.keys.
listed_lastmod``) sets an adaptive page's *first* interval: the page's age at that visit
(the visit's time minus lastmod), clamped to ``[min, max]``. The time since the last change
is the simplest estimate of how long a page goes between changes (Cho & Garcia-Molina's
age estimator, "Estimating frequency of change", 2003): a page listed as unchanged for
a month starts near ``max`` rather than climbing there by half-steps from ``min``, a page
changed an hour ago (or dated in the future: a clock's or a generator's error) starts at
``min``, as any page without a lastmod does. After that, the page's own visits steer the
interval as above. ``every`` stays fixed and ``once`` stays once: a listed date is a hint
for a rate the crawler is asked to learn, never a reason to visit more often or at all.
An unreadable lastmod is no hint. (A lastmod "not newer than the last visit" would let a
revisit count as unchanged unfetched, but no revisit carries one: a lastmod comes with a
page's first-visit job only, as sitemaps are not revisited, so that rule has nothing to
act on yet.)
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from core.errors import ConfigError

#: An adaptive interval after a changed visit is multiplied by this, after an unchanged one
#: by ``GROW`` (StormCrawler's defaults are 0.5 and 1.5 too).
SHRINK, GROW = 0.5, 1.5
#: The shortest revisit interval anyone may ask for: a page is not a live feed.
MIN_INTERVAL_S = 1.0
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _duration(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        raise ConfigError(f"not a duration: {text!r} (use e.g. 90s, 15m, 6h, 7d)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds < MIN_INTERVAL_S:
        raise ConfigError(f"revisit interval {text!r} is under {MIN_INTERVAL_S:g}s")
    return seconds


@dataclass(frozen=True)
class RevisitPolicy:
    """``mode``: once, every or adaptive; ``low_s``/``high_s``: the interval (every: both
    the same) or its bounds (adaptive)."""

    mode: str = "once"
    low_s: float = 0.0
    high_s: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> RevisitPolicy:
        words = spec.split()
        if words == ["once"]:
            return cls()
        if len(words) == 2 and words[0] == "every":
            every = _duration(words[1])
            return cls("every", every, every)
        if len(words) == 2 and words[0] == "adaptive" and ".." in words[1]:
            low, high = (_duration(w) for w in words[1].split("..", 1))
            if low > high:
                raise ConfigError(f"revisit policy {spec!r}: min is above max")
            return cls("adaptive", low, high)
        raise ConfigError(f"not a revisit policy: {spec!r} (use 'once', 'every 6h' or "
                          "'adaptive 10m..7d')")

    def next_interval(self, last_s: float | None, changed: bool,
                      listed_age_s: float | None = None) -> float | None:
        """Seconds until the next visit after one that found the page ``changed`` (or not),
        ``last_s`` being the interval that led to it (None: it was the first visit);
        None: no next visit. ``listed_age_s``: how long before this first visit a sitemap
        says the page last changed (:func:`listed_age_s`; None: no sitemap said), which
        sets an adaptive policy's first interval (clamped to its bounds)."""
        if self.mode == "once":
            return None
        if self.mode == "every":
            return self.low_s
        if last_s is None:
            if listed_age_s is None:
                return self.low_s
            return min(self.high_s, max(self.low_s, listed_age_s))
        step = SHRINK if changed else GROW
        return min(self.high_s, max(self.low_s, last_s * step))


def listed_age_s(lastmod: str | None, at: int | datetime) -> float | None:
    """Seconds from a sitemap's ``lastmod`` (ISO 8601; no zone: UTC) to ``at`` (the visit's
    time: epoch ms, or an aware datetime as a decoded timestamp-millis field reads),
    negative if it lies after it; None: no lastmod, or unreadable."""
    if not lastmod:
        return None
    try:
        when = datetime.fromisoformat(lastmod.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    at_s = at.timestamp() if isinstance(at, datetime) else at / 1000.0
    return at_s - when.timestamp()


class RevisitPolicies:
    """The policy of each target: the first pattern of ``by_pattern`` (in order) that
    matches it, else ``default``. Every spec is parsed once, here (a bad one is a
    ConfigError when the settings load)."""

    def __init__(self, default: str, by_pattern: Mapping[str, str]) -> None:
        self.default = RevisitPolicy.parse(default)
        self.patterns = [(p, RevisitPolicy.parse(spec)) for p, spec in by_pattern.items()]
        self._cache: dict[str, RevisitPolicy] = {}

    @property
    def any(self) -> bool:
        """Whether any target is ever revisited (else no revisit stage need run)."""
        return any(p.mode != "once" for p in (self.default, *(q for _, q in self.patterns)))

    def for_target(self, target: str) -> RevisitPolicy:
        policy = self._cache.get(target)
        if policy is None:
            policy = next((q for p, q in self.patterns if fnmatch.fnmatchcase(target, p)),
                          self.default)
            if len(self._cache) < 100_000:  # bounded: a site minting hosts
                self._cache[target] = policy
        return policy
