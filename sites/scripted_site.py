"""A loopback site whose every path answers what the test says, changeable while it runs.

Each route is a list of answers (status, body, headers): a path's n-th request gets the
n-th answer, and the last repeats. A test can swap a route's answers at any time (a site
that recovers), and reads how often each path was asked for.
"""

from __future__ import annotations

import asyncio
import collections
import threading

from aiohttp import web

Answer = tuple[int, str, dict[str, str]]


def page(*links: str, title: str = "page") -> Answer:
    body = "".join(f'<a href="{u}">{u}</a>' for u in links)
    return 200, f"<html><title>{title}</title><body>{body}</body></html>", {}


def status(code: int) -> Answer:
    return code, "no", {}


def redirect(to: str, code: int = 301) -> Answer:
    return code, "", {"Location": to}


class ScriptedSite:
    def __init__(self, host: str, port: int) -> None:
        assert host.startswith("127."), "test traffic stays on loopback"
        self.host, self.port = host, port
        self.routes: dict[str, list[Answer]] = {"/robots.txt": [(404, "none", {})]}
        self.requests: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="scripted-site")
        self._ready = threading.Event()
        self._runner: web.ServerRunner | None = None

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def set(self, path: str, *answers: Answer) -> None:
        with self._lock:
            self.routes[path] = list(answers)

    def count(self, path: str) -> int:
        with self._lock:
            return self.requests[path]

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        path = request.raw_path
        with self._lock:
            n = self.requests[path]
            self.requests[path] += 1
            answers = self.routes.get(path, [(404, "not here", {})])
            code, body, headers = answers[min(n, len(answers) - 1)]
        return web.Response(status=code, text=body, content_type="text/html", headers=headers)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            self._runner = web.ServerRunner(web.Server(self._handle, access_log=None))
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port).start()

        self._loop.run_until_complete(listen())
        self._ready.set()
        self._loop.run_forever()
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def __enter__(self) -> ScriptedSite:
        self._thread.start()
        assert self._ready.wait(10), "scripted site did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
