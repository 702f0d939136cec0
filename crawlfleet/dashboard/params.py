"""What a browser may ask for: a time window from a closed list and panel names from the
registry, nothing else (no SQL text, no free-form durations, no unknown keys)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from core.errors import ConfigError

#: The windows of the time control, ending now; ``all`` = the crawl's whole span in the store.
WINDOWS: dict[str, int | None] = {"15m": 900, "1h": 3600, "24h": 86400, "all": None}
DEFAULT_WINDOW = "1h"
#: The query keys a data request may carry.
KEYS = frozenset({"window", "panel"})
#: ``all`` on an empty store: the window of an hour, so every panel says why it is empty.
EMPTY_SPAN_S = 3600
#: ``all`` reaches this far before the store's first record, so that record is inside.
SPAN_MARGIN_S = 60


class ParamError(ConfigError):
    """A request parameter outside what the dashboard answers (a 400, never a query)."""


@dataclass(frozen=True)
class DataRequest:
    window: str
    panels: tuple[str, ...]


def parse_request(pairs: Iterable[tuple[str, str]], known: Collection[str]) -> DataRequest:
    """The request's window and panels from its query pairs (repeats kept), or a
    :class:`ParamError` saying what is wrong. ``known`` are the panel names; with no
    ``panel`` key every panel is asked for."""
    items = list(pairs)
    unknown = sorted({k for k, _ in items} - KEYS)
    if unknown:
        raise ParamError(f"unknown parameter(s) {', '.join(unknown)[:80]}: only window and "
                         "panel")
    windows = [v for k, v in items if k == "window"]
    if len(windows) > 1:
        raise ParamError("give one window")
    window = windows[0] if windows else DEFAULT_WINDOW
    if window not in WINDOWS:
        raise ParamError(f"window must be one of {', '.join(WINDOWS)}, not {window[:20]!r}")
    names = [v for k, v in items if k == "panel"]
    bad = [n for n in names if n not in known]
    if bad:
        raise ParamError(f"no panel {bad[0][:40]!r}")
    return DataRequest(window, tuple(dict.fromkeys(names)) or tuple(known))


def window_seconds(window: str, store_age_s: float | None) -> int:
    """The window's length in seconds; ``all`` from the age of the store's oldest record
    (``None``: an empty store)."""
    fixed = WINDOWS[window]
    if fixed is not None:
        return fixed
    if store_age_s is None or store_age_s < 0:
        return EMPTY_SPAN_S
    return int(store_age_s) + SPAN_MARGIN_S
