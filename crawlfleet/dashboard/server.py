"""The dashboard's web server: aiohttp (the crawler's own HTTP stack) on 127.0.0.1.

Every request passes :func:`~crawlfleet.dashboard.guard.refusal` first; the page's first
load trades the URL's token for a cookie and drops it from the address bar. The browser
gets the page, its static files and two JSON answers: the panels, and one window's figures
(``/api/data?window=1h[&panel=NAME...]``). Queries run off the event loop, one refresh at a
time, each through :func:`infra.store_query.run_query`: the store worker's read-only
endpoint while one runs (a connection of its own: it never holds the worker's inserts),
else the engine opened read-only for that query alone, so a store worker that starts
meanwhile gets the store within one query's time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from core.config import Settings
from core.errors import CrawlfleetError
from crawlfleet.dashboard import guard
from crawlfleet.dashboard.approvals import ApprovedSet
from crawlfleet.dashboard.data import Query, window_data
from crawlfleet.dashboard.panels import Panel, panels
from crawlfleet.dashboard.params import DEFAULT_WINDOW, WINDOWS, ParamError, parse_request
from infra.views import View

STATIC = Path(__file__).with_name("static")
#: The page loads its own files only: no script, style, font or image from anywhere else.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
          ".png": "image/png", ".svg": "image/svg+xml"}
#: Seconds between two refreshes of the page (its default; the page polls with fetch()).
REFRESH_S = 5.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Dashboard:
    """One dashboard: its token, its port once bound, and what it reads."""

    query: Query
    approved: ApprovedSet | None = None
    refresh_s: float = REFRESH_S
    token: str = ""
    port: int = 0

    def __post_init__(self) -> None:
        self.token = self.token or guard.new_token()
        self.panels: dict[str, tuple[Panel, View]] = panels()
        self._busy = asyncio.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?{guard.TOKEN_PARAM}={self.token}"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/panels", self._panels)
        app.router.add_get("/api/data", self._data)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = guard.refusal(request.headers, request.cookies, request.query, self.token,
                                self.port)
        if refused:
            resp: web.StreamResponse = _refused(request, refused)
        elif guard.TOKEN_PARAM in request.query:
            # The first load: the token moves into the cookie, out of the address bar
            # (and out of the history and any Referer).
            resp = web.Response(status=303, headers={
                "Location": request.path,
                "Set-Cookie": guard.cookie_header(self.port, self.token)})
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as exc:  # the router's 404 and 405
                resp = web.Response(status=exc.status, text=exc.reason)
        resp.headers.update(SECURITY_HEADERS)
        return resp

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return _file("index.html")

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in _shipped():
            return web.Response(status=404, text="not found")
        return _file(name)

    async def _panels(self, request: web.Request) -> web.StreamResponse:
        return _json({"panels": [p.describe() for p, _ in self.panels.values()],
                      "windows": list(WINDOWS), "default_window": DEFAULT_WINDOW,
                      "refresh_s": self.refresh_s})

    async def _data(self, request: web.Request) -> web.StreamResponse:
        try:
            req = parse_request(request.query.items(), self.panels)
        except ParamError as exc:
            return _json({"error": str(exc)}, status=400)
        approved = self.approved.snapshot() if self.approved else None
        async with self._busy:  # one refresh at a time: queries wait for each other only
            payload = await asyncio.to_thread(window_data, req, self.panels, self.query,
                                              approved)
        return _json(payload)


def _refused(request: web.Request, why: str) -> web.Response:
    if request.path.startswith("/api/"):
        return _json({"error": why}, status=403)
    text = ("<!doctype html><meta charset=utf-8><title>crawlfleet dashboard: refused</title>"
            f'<link rel="icon" href="data:,"><p>refused: {_escape(why)}</p>')
    return web.Response(status=403, text=text, content_type="text/html")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(payload, default=str),
                        content_type="application/json")


def _shipped() -> set[str]:
    return {p.name for p in STATIC.iterdir() if p.is_file()}


def _file(name: str) -> web.Response:
    path = STATIC / name
    kind = _TYPES.get(path.suffix, "text/plain")
    return web.Response(body=path.read_bytes(), content_type=kind,
                        charset="utf-8" if kind.startswith("text") else None)


async def serve(dash: Dashboard, port: int, on_ready: Callable[[str], None],
                stop: asyncio.Event | None = None) -> None:
    """Serve ``dash`` on 127.0.0.1:``port`` (0: any free port) until ``stop`` is set (or
    forever); ``on_ready`` gets the URL with its token once the port is bound."""
    runner = web.AppRunner(dash.app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", port)
        try:
            await site.start()
        except OSError as exc:
            raise CrawlfleetError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror} "
                                  "(choose another with --port, 0 = any free port)") from exc
        dash.port = int(runner.addresses[0][1])
        if dash.approved is not None:
            dash.approved.start()
        on_ready(dash.url)
        await (stop or asyncio.Event()).wait()
    finally:
        if dash.approved is not None:
            dash.approved.stop()
        await runner.cleanup()


def store_query(settings: Settings) -> Query:
    """The dashboard's query path: :func:`infra.store_query.run_query` for ``settings``."""
    from infra.store_query import run_query

    def query(sql: str) -> tuple[list[str], list[list[Any]]]:
        return run_query(settings, sql, wait_s=10.0, on_wait=lambda _text: None)

    return query
