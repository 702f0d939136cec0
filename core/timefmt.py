"""One way to print a point in time, for every command: UTC, ISO 8601, milliseconds, ``Z``.

``dlq``, ``trace``, ``sql`` and ``top`` all show times: a person comparing them, or a script
parsing them, meets one format (``2026-12-02T14:51:00.123Z``), whatever the column's type.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso_utc(ts: datetime | float) -> str:
    """``ts`` (a datetime, naive meaning UTC, or epoch seconds) as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    if not isinstance(ts, datetime):
        ts = datetime.fromtimestamp(ts, UTC)
    elif ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def clock_utc(ts: float) -> str:
    """Epoch seconds as a wall clock in UTC (``14:51:00Z``): a live screen's header."""
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%SZ")
