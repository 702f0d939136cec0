"""Broken HTTP from a raw socket server: each trap ends as its own failure class, fast;
and the address check happens where aiohttp connects (DNS rebinding is refused).

No broker: the fetcher against a loopback server that writes whatever bytes a trap needs.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from consumers.fetch.http import Fetcher
from consumers.fetch.resolver import StaticResolver
from core.config import Settings, load_settings
from core.errors import CrawlfleetError, ForbiddenAddressError

pytestmark = pytest.mark.integration

CAP = 64 * 1024
BOMB = gzip.compress(b"\0" * (4 * CAP))

RAW: dict[str, bytes] = {
    "/ok": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "/truncated": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nshort",
    "/chunk-cut": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\nhello",
    "/bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n",
    "/garbage-status": b"FOO BAR BAZ\r\n\r\nhello",
    "/http09": b"<html>an HTTP/0.9 answer has no status line</html>",
    "/header-flood": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(500))
    + b"Content-Length: 2\r\n\r\nok",
    "/long-header": b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n",
    "/two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nokxyz",
    "/bad-gzip": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\n"
    b"0123456789",
    "/bomb": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
    % len(BOMB) + BOMB,
    "/closed": b"",
}
#: Traps whose server keeps the connection open after the bad bytes.
KEEP_OPEN = {"/chunk-cut-open": RAW["/chunk-cut"], "/bad-chunk-open": RAW["/bad-chunk"]}

EXPECTED = {
    "/truncated": "truncated_body", "/chunk-cut": "truncated_body",
    "/bad-chunk": "protocol_error", "/bad-chunk-open": "protocol_error",
    "/garbage-status": "protocol_error", "/http09": "protocol_error",
    "/header-flood": "protocol_error", "/long-header": "headers_too_large",
    "/two-lengths": "protocol_error", "/bad-gzip": "protocol_error",
    "/bomb": "decompression_bomb", "/closed": "connect", "/chunk-cut-open": "timeout",
}


class RawServer:
    def __init__(self) -> None:
        self.hits: dict[str, int] = {}

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        line = await r.readline()
        while (await r.readline()) not in (b"\r\n", b""):
            pass
        path = line.split()[1].decode() if len(line.split()) > 1 else "/"
        self.hits[path] = self.hits.get(path, 0) + 1
        w.write(RAW.get(path) or KEEP_OPEN.get(path, b""))
        await w.drain()
        if path in KEEP_OPEN:
            await asyncio.sleep(5)
        w.close()


def _serve(settings: Settings, body: Callable[[RawServer, int], Awaitable[Any]],
           hosts: tuple[str, ...] = ("127.0.0.1",)) -> Any:
    async def main() -> Any:
        raw = RawServer()
        servers = [await asyncio.start_server(raw.handle, hosts[0], 0)]
        port = servers[0].sockets[0].getsockname()[1]
        for h in hosts[1:]:
            servers.append(await asyncio.start_server(raw.handle, h, port))
        try:
            return await body(raw, port)
        finally:
            for srv in servers:
                srv.close()

    return asyncio.run(main())


def _settings(**kw: Any) -> Settings:
    return load_settings(**{"allow_private": True, "max_response_bytes": CAP,
                            "request_timeout_s": 1.5, **kw})


def test_each_broken_answer_has_its_class_and_ends_fast() -> None:
    async def body(raw: RawServer, port: int) -> dict[str, tuple[str, float]]:
        out = {}
        async with Fetcher(_settings()) as f:
            assert (await f.get(f"http://127.0.0.1:{port}/ok")).body == b"ok"
            for path in EXPECTED:
                started = time.monotonic()
                with pytest.raises(CrawlfleetError) as err:
                    await f.get(f"http://127.0.0.1:{port}{path}")
                out[path] = (err.value.reason, time.monotonic() - started)
        return out
    got = _serve(_settings(), body)
    assert {p: r for p, (r, _) in got.items()} == EXPECTED
    for path, (reason, took) in got.items():
        # Only the stalled chunk waits for the total timeout; a broken one fails at once.
        assert took < (2.5 if reason == "timeout" else 0.5), (path, took)


def test_robots_over_the_cap_is_truncated_not_refused() -> None:
    big = b"User-agent: *\nDisallow: /private\n" + b"#" * (2 * CAP)
    RAW["/robots.txt"] = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big

    async def body(raw: RawServer, port: int) -> bytes:
        async with Fetcher(_settings()) as f:
            resp = await f.get(f"http://127.0.0.1:{port}/robots.txt", max_bytes=CAP,
                               truncate=True, follow_redirects=True)
            return resp.body
    assert _serve(_settings(), body) == big[:CAP]


def test_rebinding_name_is_refused_where_the_connection_is_made() -> None:
    """A name that resolves to an allowed address first and to loopback next: the second
    connection is refused before any byte is sent to loopback (127.0.0.2 plays the public
    address here, allowed by ``allow_hosts``; 127.0.0.1 is the victim)."""
    stub = StaticResolver({"rebind.test": [["127.0.0.2"], ["127.0.0.1"]]})
    s = _settings(allow_private=False, allow_hosts=("127.0.0.2/32",))

    async def body(raw: RawServer, port: int) -> None:
        url = f"http://rebind.test:{port}/ok"
        async with Fetcher(s, resolver=stub) as f:  # a fresh connection pool each time
            assert (await f.get(url)).status == 200
        async with Fetcher(s, resolver=stub) as f:
            with pytest.raises(ForbiddenAddressError, match=r"allow-hosts rebind\.test") as err:
                await f.get(url)
            assert err.value.reason == "address_not_allowed" and not err.value.retryable
            assert f.resolver.refused == 1
        assert raw.hits == {"/ok": 1}
        assert stub.calls["rebind.test"] == 2
    _serve(s, body, hosts=("127.0.0.2", "127.0.0.1"))


def test_ip_literals_are_checked_too() -> None:
    async def body(raw: RawServer, port: int) -> None:
        s = _settings(allow_private=False, allow_hosts=("127.0.0.2",))
        async with Fetcher(s) as f:
            assert (await f.get(f"http://127.0.0.2:{port}/ok")).status == 200
            with pytest.raises(ForbiddenAddressError):
                await f.get(f"http://127.0.0.1:{port}/ok")
            with pytest.raises(ForbiddenAddressError):
                await f.get(f"http://[::ffff:127.0.0.1]:{port}/ok")
        assert raw.hits == {"/ok": 1}
    _serve(_settings(), body, hosts=("127.0.0.2", "127.0.0.1"))


#: One address, six spellings a browser (and the HTTP client) reads as 127.0.0.1.
SPELLINGS = ("2130706433", "127.1", "0177.0.0.1", "127.000.000.001", "127.0.0.1.", "0x7f.1")


def test_every_spelling_of_a_refused_address_is_refused_and_never_connected() -> None:
    """The crawl allows only 127.0.0.2: each spelling of 127.0.0.1 is canonicalised to it and
    refused -- as a link (canonicalize) and as a raw job URL from an older record."""
    from core.errors import InvalidURLError
    from core.urls import canonicalize

    async def body(raw: RawServer, port: int) -> None:
        s = _settings(allow_private=False, allow_hosts=("127.0.0.2",))
        async with Fetcher(s) as f:
            for spelt in SPELLINGS:
                url = canonicalize(f"http://{spelt}:{port}/ok")
                assert url == f"http://127.0.0.1:{port}/ok"
                with pytest.raises(ForbiddenAddressError):
                    await f.get(url)
                if spelt != "127.0.0.1.":  # the raw spelling, as an old record held it
                    with pytest.raises(InvalidURLError):
                        await f.get(f"http://{spelt}:{port}/ok")
            assert (await f.get(f"http://127.0.0.2:{port}/ok")).status == 200
        assert raw.hits == {"/ok": 1}
    _serve(_settings(), body, hosts=("127.0.0.2", "127.0.0.1"))


def test_a_proxy_in_the_environment_never_routes_the_crawl(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``HTTP_PROXY`` points at a listener that counts connections: the crawl goes direct."""
    async def body(raw: RawServer, port: int) -> None:
        proxied: list[int] = []

        async def count(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            proxied.append(1)
            w.close()

        proxy = await asyncio.start_server(count, "127.0.0.1", 0)
        proxy_url = f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}"
        for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(var, proxy_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        try:
            async with Fetcher(_settings()) as f:
                assert (await f.get(f"http://127.0.0.1:{port}/ok")).status == 200
        finally:
            proxy.close()
        assert proxied == [] and raw.hits == {"/ok": 1}
    _serve(_settings(), body)
