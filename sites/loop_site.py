"""The running part every local test site shares: an aiohttp low-level server on its own
event loop in a daemon thread, listening on some loopback hosts on one port, started and
stopped as a context manager. A site subclasses it and writes only ``_handle``; given an
``ssl_context`` it serves https."""

from __future__ import annotations

import asyncio
import ssl
import threading
from typing import Self

from aiohttp import web


class LoopSite:
    def __init__(self, hosts: tuple[str, ...], port: int, name: str = "site",
                 ssl_context: ssl.SSLContext | None = None) -> None:
        assert all(h.startswith("127.") for h in hosts), "test traffic stays on loopback"
        self.listen_hosts, self.port, self.ssl_context = hosts, port, ssl_context
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._ready = threading.Event()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raise NotImplementedError

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> web.ServerRunner:
            runner = web.ServerRunner(web.Server(self._handle, access_log=None))
            await runner.setup()
            for host in self.listen_hosts:
                await web.TCPSite(runner, host, self.port,
                                  ssl_context=self.ssl_context).start()
            return runner

        runner = self._loop.run_until_complete(listen())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10), f"{self._thread.name} did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
