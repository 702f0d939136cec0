"""The HTTP client of the fetch stage: aiohttp with every cap a polite crawler needs.

Redirects are followed by hand so each hop is re-checked (scheme, address, cap); bodies
are streamed and capped after decompression; every request has a total timeout (aiohttp
can otherwise wait forever on a malformed chunked body).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import aiohttp

from crawlfleet.config import Settings
from crawlfleet.errors import (
    ConnectError,
    FetchTimeoutError,
    InvalidURLError,
    ResponseTooLargeError,
    TooManyRedirectsError,
)
from crawlfleet.urls import canonicalize, check_address

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
HTTP_LIB_VERSION = f"aiohttp/{aiohttp.__version__}"
TLS_LIB_VERSION = ssl.OPENSSL_VERSION


@dataclass
class Response:
    url: str  # final URL after redirects
    status: int
    content_type: str
    body: bytes
    retry_after: str | None
    elapsed_ms: int
    redirects: list[str] = field(default_factory=list)


class Fetcher:
    """One aiohttp session per worker; safe for hundreds of concurrent requests."""

    def __init__(self, settings: Settings) -> None:
        self._s = settings
        self._session: aiohttp.ClientSession | None = None
        self._checked_hosts: dict[str, None] = {}

    async def __aenter__(self) -> Fetcher:
        connector = aiohttp.TCPConnector(limit=self._s.max_inflight, ttl_dns_cache=300,
                                         enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"User-Agent": self._s.user_agent, "Accept-Encoding": "gzip, deflate"},
            timeout=aiohttp.ClientTimeout(total=self._s.request_timeout_s,
                                          connect=self._s.connect_timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def get(self, url: str, max_bytes: int | None = None) -> Response:
        """GET ``url`` following redirects within limits; raise a classified error."""
        assert self._session is not None, "use Fetcher as an async context manager"
        started = time.monotonic()
        redirects: list[str] = []
        current = url
        cap = max_bytes or self._s.max_response_bytes
        try:
            async with asyncio.timeout(self._s.request_timeout_s):
                while True:
                    await self._check_host(current)
                    async with self._session.get(current, allow_redirects=False) as resp:
                        location = resp.headers.get("Location")
                        if resp.status in REDIRECT_STATUSES and location:
                            if len(redirects) >= self._s.max_redirects:
                                raise TooManyRedirectsError(
                                    f"more than {self._s.max_redirects} redirects from {url}")
                            redirects.append(current)
                            current = canonicalize(urljoin(current, location))
                            continue
                        body = await _read_capped(resp, cap)
                        return Response(current, resp.status,
                                        resp.headers.get("Content-Type", ""), body,
                                        resp.headers.get("Retry-After"),
                                        int((time.monotonic() - started) * 1000), redirects)
        except TimeoutError as exc:
            raise FetchTimeoutError(f"no complete answer from {current} within "
                                    f"{self._s.request_timeout_s}s") from exc
        except aiohttp.ClientResponseError as exc:
            raise ConnectError(f"bad response from {current}: {exc.message}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectError(f"{type(exc).__name__} fetching {current}: {exc}") from exc

    async def _check_host(self, url: str) -> None:
        """Refuse private/loopback/link-local destinations unless allowed (SSRF guard)."""
        if self._s.allow_private:
            return
        host = urlsplit(url).hostname or ""
        if host in self._checked_hosts:
            return
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ConnectError(f"cannot resolve {host}: {exc}") from exc
        if not infos:
            raise InvalidURLError(f"{host} resolves to no address")
        for info in infos:
            check_address(str(info[4][0]), allow_private=False)
        self._checked_hosts[host] = None


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    declared = resp.content_length
    if declared is not None and declared > cap:
        raise ResponseTooLargeError(f"Content-Length {declared} exceeds cap {cap}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(65536):  # decompressed bytes
        size += len(chunk)
        if size > cap:
            raise ResponseTooLargeError(f"body exceeds cap {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
