"""The fetch stage's HTTP client against a real local server: every cap is enforced.

No broker here, only aiohttp on 127.0.0.1: what a hostile or broken site can do to a
fetcher (huge bodies, endless redirects, trickled bodies, redirects to other schemes or to
private addresses) must end as a classified error, never a hang or an unbounded read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from consumers.fetch.http import Fetcher, Response
from core.config import Settings, load_settings
from core.errors import (
    FetchTimeoutError,
    ForbiddenAddressError,
    InvalidURLError,
    ResponseTooLargeError,
    TooManyRedirectsError,
)

pytestmark = pytest.mark.integration

CAP = 4096


async def _big(_: web.Request) -> web.Response:
    return web.Response(body=b"x" * (CAP + 1))


async def _big_chunked(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.enable_chunked_encoding()  # no Content-Length: the cap must hold while streaming
    await resp.prepare(request)
    for _ in range(8):
        await resp.write(b"y" * 1024)
    await resp.write_eof()
    return resp


async def _hop(request: web.Request) -> web.Response:
    n = int(request.match_info["n"])
    if n == 0:
        return web.Response(text="arrived")
    raise web.HTTPFound(f"/hop/{n - 1}")


async def _trickle(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    while True:  # a body that never ends, one byte at a time
        await resp.write(b".")
        await asyncio.sleep(0.1)


async def _to_ftp(_: web.Request) -> web.Response:
    raise web.HTTPFound("ftp://127.0.0.1/file")


def _serve(settings: Settings,
           body: Callable[[Fetcher, str, dict[str, int]], Awaitable[Any]]) -> Any:
    """Run ``body(fetcher, base_url, hits)`` against a fresh local server."""
    hits: dict[str, int] = {}

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        hits[request.path] = hits.get(request.path, 0) + 1
        return await handler(request)  # type: ignore[no-any-return]

    async def main() -> Any:
        app = web.Application(middlewares=[count])
        app.router.add_get("/big", _big)
        app.router.add_get("/big-chunked", _big_chunked)
        app.router.add_get("/hop/{n}", _hop)
        app.router.add_get("/trickle", _trickle)
        app.router.add_get("/to-ftp", _to_ftp)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with Fetcher(settings) as fetcher:
                return await body(fetcher, f"http://127.0.0.1:{port}", hits)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def _settings(**kw: Any) -> Settings:
    return load_settings(**{"allow_private": True, "max_response_bytes": CAP,
                            "max_redirects": 3, "request_timeout_s": 1.0, **kw})


def test_body_over_the_cap_is_refused_declared_or_streamed() -> None:
    async def body(f: Fetcher, base: str, hits: dict[str, int]) -> None:
        with pytest.raises(ResponseTooLargeError, match="Content-Length"):
            await f.get(base + "/big")
        with pytest.raises(ResponseTooLargeError, match="exceeds cap"):
            await f.get(base + "/big-chunked")
    _serve(_settings(), body)


def test_a_page_redirect_is_returned_not_followed() -> None:
    async def body(f: Fetcher, base: str, hits: dict[str, int]) -> Response:
        resp = await f.get(base + "/hop/3")
        assert hits == {"/hop/3": 1}  # one request: the target is a job of its own
        return resp
    resp = _serve(_settings(), body)
    assert resp.status == 302 and resp.location == "/hop/2" and resp.body == b""


def test_robots_redirects_are_followed_up_to_the_cap() -> None:
    async def body(f: Fetcher, base: str, hits: dict[str, int]) -> Response:
        ok = await f.get(base + "/hop/3", follow_redirects=True)
        with pytest.raises(TooManyRedirectsError):
            await f.get(base + "/hop/4", follow_redirects=True)
        assert hits["/hop/0"] == 1  # the over-long chain never reached its end
        return ok
    ok = _serve(_settings(), body)
    assert ok.status == 200 and ok.body == b"arrived"
    assert ok.url.endswith("/hop/0") and len(ok.redirects) == 3


def test_redirect_to_another_scheme_is_refused() -> None:
    async def body(f: Fetcher, base: str, hits: dict[str, int]) -> None:
        with pytest.raises(InvalidURLError, match="scheme"):
            await f.get(base + "/to-ftp", follow_redirects=True)
    _serve(_settings(), body)


def test_a_body_that_never_ends_times_out() -> None:
    async def body(f: Fetcher, base: str, hits: dict[str, int]) -> float:
        started = time.monotonic()
        with pytest.raises(FetchTimeoutError):
            await f.get(base + "/trickle")
        return time.monotonic() - started
    took = _serve(_settings(request_timeout_s=1.0), body)
    assert 0.9 <= took < 5.0


def test_loopback_is_refused_unless_allowed_and_nothing_is_sent() -> None:
    async def body(f: Fetcher, base: str, hits: dict[str, int]) -> None:
        with pytest.raises(ForbiddenAddressError, match="--allow-private"):
            await f.get(base + "/hop/0")
        assert hits == {}
    _serve(_settings(allow_private=False), body)
