"""The fleet's approved version tuples, for the version panel's marks: read from
``crawl.control`` in a thread of its own, every ``every_s``, never on a page request (a
broker that is down costs the page nothing but a note that the set is unknown)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from core.config import Settings
from core.errors import CrawlfleetError

#: How often the approved set is read again.
REFRESH_S = 30.0


class ApprovedSet:
    """The last approved set read (``None`` until one was), as the page shows it."""

    def __init__(self, read: Callable[[], set[str]], every_s: float = REFRESH_S) -> None:
        self._read = read
        self._every_s = every_s
        self._lock = threading.Lock()
        self._tuples: list[str] | None = None
        self._note = "reading the approved set from crawl.control"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="dashboard-approved-set")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def refresh(self) -> None:
        try:
            tuples = sorted(self._read())
            note = ("empty: no enforcement (every version may consume)" if not tuples
                    else f"{len(tuples)} approved")
        except CrawlfleetError as exc:
            with self._lock:
                self._note = f"approved set unknown: {exc}"
            return
        with self._lock:
            self._tuples, self._note = tuples, note + f" (read {time.strftime('%H:%M:%S')})"

    def snapshot(self) -> dict[str, Any]:
        """``tuples`` None = unknown; an empty list = no enforcement (nothing marked)."""
        with self._lock:
            return {"tuples": self._tuples, "note": self._note}

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._every_s)


def from_control(settings: Settings) -> ApprovedSet:
    """An :class:`ApprovedSet` read from the fleet's control topic."""
    from producers.control import approved

    return ApprovedSet(lambda: approved(settings))
