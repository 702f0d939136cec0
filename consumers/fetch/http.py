"""The HTTP client of the fetch stage: aiohttp with every cap a polite crawler needs.

A page fetch makes exactly one request: a redirect comes back as a 3xx :class:`Response`
with its ``location``, and the fetch stage turns the target into a job of its own (scope,
dedupe, robots.txt and rate cap of *its* target apply). Only robots.txt follows redirects
here (RFC 9309 §2.3.1.2), each hop re-checked: a hop the address policy refuses raises
:class:`ForbiddenRedirectError`, told apart from a URL refused itself. Every resolved
address passes the address policy where the connection is made (:class:`GuardedResolver`);
bodies are streamed and capped after decompression; every request has a total timeout
(aiohttp can otherwise wait forever on a malformed chunked body); every exception maps to a
failure class in one place (:func:`consumers.fetch.classify.classify_exception`). Header bytes
that are not UTF-8 never reach a record as lone surrogates (:func:`header_text`,
:func:`location_text`).

Each request carries its :class:`Identity`: the profile's User-Agent and headers, its
(target, profile) cookie jar (the session itself keeps none), and its egress. Through a
proxy, the address policy still holds: the host is resolved and checked here
(:meth:`Fetcher._checked_address`), and the proxy is asked for the checked address itself
(absolute-form for http, CONNECT for https), the name kept as Host header and TLS server
name, so a proxy never resolves a name on our behalf (a rebinding answer, a name that
points inside). The proxy's own name is trusted for the connection to the proxy only: it is
resolved apart (:class:`ProxyAddresses`), so a crawl URL on that name is checked like any
other. Proxy credentials travel in the proxy URL only and never reach a message.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver
from yarl import URL

from consumers.fetch.classify import classify_exception
from consumers.fetch.conditional import request_headers, response_validators
from consumers.fetch.exchange import Exchange, exchange_of
from consumers.fetch.proxy_address import ProxyAddresses
from consumers.fetch.resolver import GuardedResolver
from core.config import Settings
from core.errors import (
    ConfigError,
    CrawlfleetError,
    DecompressionBombError,
    FetchTimeoutError,
    ForbiddenAddressError,
    ForbiddenRedirectError,
    InvalidURLError,
    ResponseTooLargeError,
    TooManyRedirectsError,
)
from core.urls import AddressPolicy, canonicalize, ends_in_number, host_of

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: A compressed body that inflates more than this many times its wire size (as read so far,
#: read-ahead included) past the cap is a bomb; HTML compresses 5-10 times.
BOMB_RATIO = 20
#: Parser caps (aiohttp's defaults, named): a longer status/header line is
#: ``headers_too_large``, more headers than this a ``protocol_error``.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 128


@dataclass
class Response:
    url: str  # final URL (after redirects, for robots.txt; the requested URL for pages)
    status: int
    content_type: str
    body: bytes
    retry_after: str | None
    elapsed_ms: int
    redirects: list[str] = field(default_factory=list)
    location: str | None = None  # a redirect's Location header, as sent
    #: The answer's ``etag`` and ``last_modified`` (``conditional.response_validators``).
    validators: dict[str, str] = field(default_factory=dict)
    #: The request as sent and the answer's status line and headers (for WARC records).
    exchange: Exchange = field(default_factory=Exchange)


@dataclass(frozen=True)
class Identity:
    """Who one request is sent as: ``headers`` (the profile's User-Agent and extra
    headers), ``jar`` (the (target, profile) cookie jar; None sends no cookies) and
    ``proxy`` (the egress's forward proxy URL, credentials included; None: direct)."""

    headers: dict[str, str] = field(default_factory=dict)
    jar: aiohttp.CookieJar | None = None
    proxy: str | None = None

    def __repr__(self) -> str:  # never the proxy's credentials
        return f"Identity(headers={self.headers!r}, proxied={self.proxy is not None})"


def address_policy(settings: Settings) -> AddressPolicy:
    return AddressPolicy.of(settings.allow_private, settings.allow_hosts)


def tls_context(settings: Settings) -> ssl.SSLContext | bool:
    """Certificates are always verified: against the system's trust store, plus the CAs of
    ``tls_ca_file`` when set."""
    if not settings.tls_ca_file:
        return True
    ctx = ssl.create_default_context()
    try:
        ctx.load_verify_locations(cafile=settings.tls_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_ca_file {settings.tls_ca_file!r}: {exc}") from exc
    return ctx


class Fetcher:
    """One aiohttp session per worker; safe for hundreds of concurrent requests.

    ``resolver`` replaces the system resolver under the address guard (tests use a
    :class:`consumers.fetch.resolver.StaticResolver` to play a rebinding DNS server).
    """

    def __init__(self, settings: Settings, resolver: AbstractResolver | None = None) -> None:
        self._s = settings
        self._session: aiohttp.ClientSession | None = None
        self.policy = address_policy(settings)
        #: IP-literal hosts the policy has allowed (a pure function of the host): asked once.
        self._allowed_literals: set[str] = set()
        inner = resolver if resolver is not None else DefaultResolver()
        #: Every name a crawl URL names is checked; a proxy's name, resolved for the
        #: connection to the proxy only, is not (``consumers.fetch.proxy_address``).
        self.resolver = GuardedResolver(self.policy, inner)
        self.proxies = ProxyAddresses(inner)

    async def __aenter__(self) -> Fetcher:
        connector = aiohttp.TCPConnector(limit=self._s.max_inflight, ttl_dns_cache=300,
                                         resolver=self.resolver, enable_cleanup_closed=True,
                                         ssl=tls_context(self._s))
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"User-Agent": self._s.user_agent, "Accept-Encoding": "gzip, deflate"},
            timeout=aiohttp.ClientTimeout(total=self._s.request_timeout_s,
                                          connect=self._s.connect_timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # an HTTP_PROXY in the environment never routes the crawl
            max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
        await self.resolver.close()

    async def get(self, url: str, max_bytes: int | None = None, *,
                  follow_redirects: bool = False, truncate: bool = False,
                  identity: Identity | None = None,
                  conditional: Mapping[str, str] | None = None) -> Response:
        """GET ``url`` as ``identity``; raise a classified :class:`CrawlfleetError` on any
        failure (never naming a proxy's credentials).

        A redirect is returned as it is unless ``follow_redirects`` (robots.txt), which
        follows up to ``max_redirects`` hops, never the same URL twice. ``truncate`` keeps
        the first ``max_bytes`` of a longer body instead of refusing it (robots.txt).
        ``conditional``: a revisit's last validators, sent as ``If-None-Match`` /
        ``If-Modified-Since`` with the request of ``url`` (not with a redirect's hops).
        """
        try:
            return await self._get(url, max_bytes, follow_redirects, truncate,
                                   identity or Identity(), request_headers(conditional))
        except CrawlfleetError as exc:
            secret = _password(identity.proxy) if identity and identity.proxy else None
            if secret and secret in str(exc):
                raise type(exc)(str(exc).replace(secret, "***")) from None
            raise

    async def _get(self, url: str, max_bytes: int | None, follow_redirects: bool,
                   truncate: bool, identity: Identity,
                   conditional: dict[str, str]) -> Response:
        assert self._session is not None, "use Fetcher as an async context manager"
        started = time.monotonic()
        redirects: list[str] = []
        current = url
        cap = max_bytes or self._s.max_response_bytes
        try:
            async with asyncio.timeout(self._s.request_timeout_s):
                while True:
                    self._check_literal(current)
                    async with self._request(current, identity,
                                             conditional if current == url else None) as resp:
                        if identity.jar is not None:
                            identity.jar.update_cookies(resp.cookies, URL(current))
                        location = resp.headers.get("Location")
                        ctype = header_text(resp.headers.get("Content-Type", ""))
                        retry_after = resp.headers.get("Retry-After")
                        retry_after = None if retry_after is None else header_text(retry_after)
                        if resp.status in REDIRECT_STATUSES and location:
                            location = location_text(location)
                            if not follow_redirects:
                                return Response(current, resp.status, ctype, b"", retry_after,
                                                _ms(started), redirects, location,
                                                exchange=exchange_of(resp, current))
                            redirects.append(current)
                            current = canonicalize(urljoin(current, location))
                            if len(redirects) > self._s.max_redirects or current in redirects:
                                raise TooManyRedirectsError(
                                    f"redirect loop or more than {self._s.max_redirects} "
                                    f"redirects from {url}")
                            continue
                        body = await _read_capped(resp, cap, truncate)
                        return Response(current, resp.status, ctype, body, retry_after,
                                        _ms(started), redirects,
                                        validators=_validators(resp.headers),
                                        exchange=exchange_of(resp, current))
        except ForbiddenAddressError as exc:
            if not redirects:
                raise  # the URL asked for is itself refused
            raise ForbiddenRedirectError(f"{url} redirects to {current}, which is refused: "
                                         f"{exc}") from exc
        except CrawlfleetError:
            raise
        except TimeoutError as exc:
            raise FetchTimeoutError(f"no complete answer from {current} within "
                                    f"{self._s.request_timeout_s}s") from exc
        except Exception as exc:  # every other failure gets its class, never escapes raw
            raise classify_exception(exc, current) from exc

    def _request(self, url: str, identity: Identity,
                 extra: dict[str, str] | None = None) -> Any:
        """The request of one hop as ``identity`` (an aiohttp request context manager),
        with ``extra`` headers (a revisit's conditional ones)."""
        assert self._session is not None
        headers = {**identity.headers, **(extra or {})}
        if identity.jar is not None:
            cookies = identity.jar.filter_cookies(URL(url))
            if cookies:
                headers["Cookie"] = "; ".join(f"{k}={m.value}" for k, m in cookies.items())
        if identity.proxy is None:
            return self._session.get(url, allow_redirects=False, headers=headers)
        return _ProxiedGet(self, url, headers, identity.proxy)

    async def checked_address(self, url: str) -> tuple[str, dict[str, Any]]:
        """``url`` with its host replaced by an address the policy allows (resolved here,
        by the guarded resolver), and the request options that keep the name: the Host
        header and, for https, the TLS server name. An IP literal is kept as it is."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        try:
            ipaddress.ip_address(host)
            return url, {}
        except ValueError:
            pass
        port = parts.port or (443 if parts.scheme == "https" else 80)
        answers = await self.resolver.resolve(host, port, socket.AF_UNSPEC)
        ip = str(answers[0]["host"])
        shown = f"[{ip}]" if ":" in ip else ip
        netloc = f"{shown}:{parts.port}" if parts.port else shown
        extra: dict[str, Any] = {"headers": {"Host": parts.netloc.rsplit("@", 1)[-1]}}
        if parts.scheme == "https":
            extra["server_hostname"] = host
        return parts._replace(netloc=netloc).geturl(), extra

    def _check_literal(self, url: str) -> None:
        """IP-literal hosts never reach a resolver: check them against the policy here."""
        host = host_of(url)
        if host in self._allowed_literals:
            return
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if ends_in_number(host):  # 2130706433, 127.1: an address in a spelling that
                # canonicalize never emits (a record from before it did), sent past any
                # resolver by the HTTP client: refused, never connected to.
                raise InvalidURLError(f"non-canonical numeric host in {url!r}") from None
            return  # a name: the guarded resolver checks each address it resolves to
        self.policy.check(host, host)
        if len(self._allowed_literals) >= 4096:
            self._allowed_literals.clear()
        self._allowed_literals.add(host)


class _ProxiedGet:
    """One GET through a forward proxy to the checked address (an async context manager
    like aiohttp's, since the address is resolved first, asynchronously)."""

    def __init__(self, fetcher: Fetcher, url: str, headers: dict[str, str],
                 proxy: str) -> None:
        self.fetcher, self.url, self.headers, self.proxy = fetcher, url, headers, proxy
        self._cm: Any = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        assert self.fetcher._session is not None
        address_url, extra = await self.fetcher.checked_address(self.url)
        proxy = await self.fetcher.proxies.url(self.proxy)
        headers = {**self.headers, **extra.pop("headers", {})}
        self._cm = self.fetcher._session.get(address_url, allow_redirects=False,
                                             headers=headers, proxy=proxy, **extra)
        resp: aiohttp.ClientResponse = await self._cm.__aenter__()
        return resp

    async def __aexit__(self, *exc: Any) -> None:
        if self._cm is not None:
            await self._cm.__aexit__(*exc)


def _password(proxy: str) -> str | None:
    return urlsplit(proxy).password


def _validators(headers: Mapping[str, str]) -> dict[str, str]:
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    return response_validators(None if etag is None else header_text(etag),
                               None if modified is None else header_text(modified))


def header_text(value: str) -> str:
    """A header value as text any string field can carry. aiohttp decodes bytes that are
    not UTF-8 as lone surrogates (``surrogateescape``), which neither Avro nor ClickHouse
    strings can encode: a stage would fail on the record. Those bytes become U+FFFD."""
    if value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def location_text(value: str) -> str:
    """A Location header with each non-ASCII byte percent-encoded, so the URL followed
    names the very bytes the server sent (``/caf\\xe9`` → ``/caf%E9``; UTF-8 ``/café``
    → ``/caf%C3%A9``, as canonicalisation writes it anyway)."""
    if value.isascii():
        return value
    raw = value.encode("utf-8", "surrogateescape")
    return "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in raw)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


async def _read_capped(resp: aiohttp.ClientResponse, cap: int, truncate: bool = False) -> bytes:
    declared = resp.content_length
    if declared is not None and declared > cap and not truncate:
        raise ResponseTooLargeError(f"Content-Length {declared} exceeds cap {cap}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(65536):  # decompressed bytes
        size += len(chunk)
        if size > cap:
            if truncate:
                chunks.append(chunk[:len(chunk) - (size - cap)])
                break
            wire = resp.content.total_raw_bytes
            if resp.headers.get("Content-Encoding") and size > BOMB_RATIO * max(wire, 1):
                raise DecompressionBombError(
                    f"body inflates past cap {cap} bytes from {wire} bytes on the wire")
            raise ResponseTooLargeError(f"body exceeds cap {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
