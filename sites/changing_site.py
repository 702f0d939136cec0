"""A loopback site whose pages change when the test says, answering conditional GETs.

Each page has a version (``change(path)`` bumps it) and a way of telling a client what it
holds: ``etag`` (an ETag per version, 304 to a matching ``If-None-Match``),
``last_modified`` (a Last-Modified per version, 304 to an ``If-Modified-Since`` not older),
``none`` (no validators: the crawler's text signature decides) or ``clock`` (no
validators, and the page prints the time of each answer: its only change is a timestamp
unless its version moves). The test reads how often each path was asked for and answered
304, and the conditional headers each request sent.
"""

from __future__ import annotations

import collections
import email.utils
import threading
import time
from dataclasses import dataclass, field

from aiohttp import web

from sites.scripted_site import ScriptedSite

MODES = ("etag", "last_modified", "none", "clock")
#: Version 0 of every page was modified at this time; version n, n hours later.
EPOCH_S = 1_780_000_000


@dataclass
class _Page:
    mode: str
    version: int = 0
    links: list[str] = field(default_factory=list)


class ChangingSite(ScriptedSite):
    """Pages added with :meth:`add`; every other path answers as a :class:`ScriptedSite`."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.pages: dict[str, _Page] = {}
        self.not_modified: collections.Counter[str] = collections.Counter()
        #: (path, If-None-Match, If-Modified-Since) of every request to a page.
        self.conditionals: list[tuple[str, str | None, str | None]] = []
        self._pages_lock = threading.Lock()

    def add(self, path: str, mode: str, links: list[str] | None = None) -> str:
        assert mode in MODES, mode
        with self._pages_lock:
            self.pages[path] = _Page(mode, links=list(links or []))
        return self.url(path)

    def change(self, path: str) -> None:
        with self._pages_lock:
            self.pages[path].version += 1

    def body(self, path: str, version: int) -> str:
        """What version ``version`` of ``path`` says (its words change with the version)."""
        words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
        return f"Page {path} says {words[version % len(words)]} {words[version // 8 % 8]}."

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        path = request.raw_path
        with self._pages_lock:
            pg = self.pages.get(path)
            if pg is not None:
                self.conditionals.append((path, request.headers.get("If-None-Match"),
                                          request.headers.get("If-Modified-Since")))
                version, mode, links = pg.version, pg.mode, list(pg.links)
        if pg is None:
            return await super()._handle(request)
        with self._lock:
            self.requests[path] += 1
        headers: dict[str, str] = {}
        if mode == "etag":
            headers["ETag"] = f'"{path}-v{version}"'
            if request.headers.get("If-None-Match") == headers["ETag"]:
                return self._unchanged(path, headers)
        elif mode == "last_modified":
            modified = EPOCH_S + 3600 * version
            headers["Last-Modified"] = email.utils.formatdate(modified, usegmt=True)
            since = request.headers.get("If-Modified-Since")
            when = email.utils.parsedate_to_datetime(since).timestamp() if since else None
            if when is not None and when >= modified:
                return self._unchanged(path, headers)
        text = self.body(path, version)
        if mode == "clock":
            text += f" Served at {time.strftime('%H:%M:%S')} ({time.time_ns()})."
        anchors = "".join(f'<a href="{u}">{u}</a>' for u in links)
        html = f"<html><title>{path}</title><body><p>{text}</p>{anchors}</body></html>"
        return web.Response(status=200, text=html, content_type="text/html", headers=headers)

    def _unchanged(self, path: str, headers: dict[str, str]) -> web.Response:
        with self._pages_lock:
            self.not_modified[path] += 1
        return web.Response(status=304, headers=headers)
