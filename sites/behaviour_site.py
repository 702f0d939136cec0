"""A loopback site whose hosts each behave one way: fine, slow, silent, flaky or resting.

Every host is a distinct 127.0.0.x address on one port, so each is its own crawl target.
Pages carry no links (the tests publish their URLs), and the site logs every request with
its arrival time and counts how many requests each host had open at once, so a test can
referee rates and connection limits at the site itself.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass

from aiohttp import web

from sites.site_spec import canonical_url


@dataclass(frozen=True)
class Behaviour:
    delay_s: float = 0.0  # wait this long before answering (longer than the timeout: silent)
    status: int = 200
    retry_after: str | None = None  # with a non-200 ``status``
    flaky_every: int = 0  # every n-th page answers 503 on its first request only
    flaky_retry_after: str | None = None  # Retry-After of those 503s
    #: 403 to requests whose User-Agent starts with one of these product tokens (a site that
    #: bans one crawl identity)
    block_agents: tuple[str, ...] = ()
    #: 403 to requests a tagging test proxy carried (header ``X-Test-Egress``, see
    #: :mod:`sites.egress_tag`): a site that bans one exit address
    block_egress: tuple[str, ...] = ()
    #: 403 to every page request after this many (-1: never): a site that, once it has
    #: said no, says no to everything
    block_after: int = -1


@dataclass(frozen=True)
class Seen:
    """One request as the site saw it."""

    at: float  # monotonic
    host: str
    path: str
    agent: str  # the User-Agent's product token
    egress: str  # the tagging proxy's name, "" when it came direct
    status: int


class BehaviourSite:
    def __init__(self, port: int, hosts: dict[str, Behaviour]) -> None:
        assert all(h.startswith("127.") for h in hosts), "test traffic stays on loopback"
        self.port, self.hosts = port, hosts
        self.log: list[tuple[float, str, str]] = []  # (monotonic time, host, path)
        self.open_now: collections.Counter[str] = collections.Counter()
        self.max_open: collections.Counter[str] = collections.Counter()
        self._answered: set[tuple[str, str]] = set()
        self.seen: list[Seen] = []  # every request with who sent it and what it got
        self._page_requests: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="behaviour-site")
        self._ready = threading.Event()
        self._runner: web.ServerRunner | None = None

    def url(self, host: str, i: int) -> str:
        return canonical_url(f"http://{host}:{self.port}/p/{i}.html")

    def urls(self, host: str, n: int) -> list[str]:
        return [self.url(host, i) for i in range(n)]

    def pages(self, host: str | None = None) -> list[tuple[float, str, str]]:
        """Page requests (not robots.txt) in arrival order, of one host or all."""
        with self._lock:
            return [r for r in self.log if r[2] != "/robots.txt" and host in (None, r[1])]

    def flaky(self, host: str, i: int) -> bool:
        every = self.hosts[host].flaky_every
        return every > 0 and i % every == every - 1

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        host = request.host.split(":")[0]
        path = request.raw_path
        b = self.hosts.get(host, Behaviour(status=404))
        with self._lock:
            self.log.append((time.monotonic(), host, path))
            self.open_now[host] += 1
            self.max_open[host] = max(self.max_open[host], self.open_now[host])
            first = (host, path) not in self._answered
            self._answered.add((host, path))
        agent = request.headers.get("User-Agent", "").split("/", 1)[0]
        egress = request.headers.get("X-Test-Egress", "")
        resp = self._answer(b, host, path, first, agent, egress)
        try:
            answer = await resp
            with self._lock:
                self.seen.append(Seen(time.monotonic(), host, path, agent, egress,
                                      answer.status))
            return answer
        finally:
            with self._lock:
                self.open_now[host] -= 1

    async def _answer(self, b: Behaviour, host: str, path: str, first: bool, agent: str,
                      egress: str) -> web.Response:
        if path != "/robots.txt":
            with self._lock:
                self._page_requests[host] += 1
                n = self._page_requests[host]
            if agent in b.block_agents or egress in b.block_egress or (
                    0 <= b.block_after < n):
                return web.Response(status=403, text="no")
        if path == "/robots.txt":
            return web.Response(status=404, text="no rules")
        if b.delay_s:
            await asyncio.sleep(b.delay_s)
        if b.status != 200:
            headers = {"Retry-After": b.retry_after} if b.retry_after else {}
            return web.Response(status=b.status, text="no", headers=headers)
        digits = path.removeprefix("/p/").removesuffix(".html")
        if first and digits.isdigit() and self.flaky(host, int(digits)):
            headers = {"Retry-After": b.flaky_retry_after} if b.flaky_retry_after else {}
            return web.Response(status=503, text="busy", headers=headers)
        return web.Response(text=f"<html><title>{path}</title><p>{path}</p></html>",
                            content_type="text/html")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            self._runner = web.ServerRunner(web.Server(self._handle, access_log=None))
            await self._runner.setup()
            for host in self.hosts:
                await web.TCPSite(self._runner, host, self.port).start()

        self._loop.run_until_complete(listen())
        self._ready.set()
        self._loop.run_forever()
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.shutdown())
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def __enter__(self) -> BehaviourSite:
        self._thread.start()
        assert self._ready.wait(10), "behaviour site did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
