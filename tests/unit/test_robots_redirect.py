"""A robots.txt that redirects to a refused address: the origin is allowed, only its
robots.txt cannot be fetched, so it is *unreachable* (RFC 9309 §2.3.1.4: disallow all, try
again later) and its jobs end ``robots_unreachable``; only an origin whose own address the
policy refuses is *refused* (``address_not_allowed``). A real :class:`Fetcher` against a raw
loopback server; the refused address is loopback too, so even a broken guard would send
nothing off this machine."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from consumers.fetch.http import Fetcher
from consumers.fetch.robots_cache import RobotsCache
from core import errors
from core.config import Settings
from core.errors import ForbiddenAddressError
from sites.demo_server import free_port

ALLOWED, REFUSED = "127.0.0.2", "127.0.0.3"


async def _serve(port: int, asked: collections.Counter[tuple[str, str]]) -> list[asyncio.Server]:
    """Both hosts answer robots.txt with a 302 to the refused host's robots.txt."""
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        line = await r.readline()
        while (await r.readline()) not in (b"\r\n", b""):
            pass
        asked[(str(w.get_extra_info("sockname")[0]), line.split()[1].decode())] += 1
        w.write(f"HTTP/1.1 302 Found\r\nLocation: http://{REFUSED}:{port}/robots.txt\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
        await w.drain()
        w.close()
    return [await asyncio.start_server(handle, h, port) for h in (ALLOWED, REFUSED)]


@pytest.fixture
def port() -> int:
    return free_port((ALLOWED, REFUSED), 18700)


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, allow_hosts=(ALLOWED,), connect_timeout_s=1.0,
                    request_timeout_s=2.0)


def test_a_refused_redirect_hop_is_told_apart_from_a_refused_url(tmp_path: Path,
                                                                 port: int) -> None:
    asked: collections.Counter[tuple[str, str]] = collections.Counter()

    async def main() -> None:
        servers = await _serve(port, asked)
        async with Fetcher(_settings(tmp_path)) as f:
            with pytest.raises(errors.ForbiddenRedirectError, match=f"redirects to http://{REFUSED}"):
                await f.get(f"http://{ALLOWED}:{port}/robots.txt", follow_redirects=True)
            with pytest.raises(ForbiddenAddressError) as refused:
                await f.get(f"http://{REFUSED}:{port}/robots.txt", follow_redirects=True)
            assert not isinstance(refused.value, errors.ForbiddenRedirectError)
        for srv in servers:
            srv.close()

    asyncio.run(main())
    assert asked == {(ALLOWED, "/robots.txt"): 1}  # the refused host: never connected to


def test_robots_redirecting_to_a_refused_address_is_unreachable_not_refused(
        tmp_path: Path, port: int) -> None:
    asked: collections.Counter[tuple[str, str]] = collections.Counter()
    cache = RobotsCache("crawlfleet", 3600.0, lambda target, interval: None)

    async def main() -> None:
        servers = await _serve(port, asked)
        async with Fetcher(_settings(tmp_path)) as f:
            cache.fetcher = f
            allowed = f"http://{ALLOWED}:{port}/page"
            assert await cache.rules_for(allowed, ALLOWED) is None  # fetched just now
            rules = cache.known(allowed)
            assert rules is not None and rules.unreachable and rules.refused is None
            assert not rules.allows(allowed, "crawlfleet")  # complete disallow, for now
            assert await cache.rules_for(allowed, ALLOWED) is rules  # cached, not refused
            with pytest.raises(ForbiddenAddressError):  # the origin itself: refused
                await cache.rules_for(f"http://{REFUSED}:{port}/page", REFUSED)
        for srv in servers:
            srv.close()

    asyncio.run(main())
    assert asked == {(ALLOWED, "/robots.txt"): 1}
