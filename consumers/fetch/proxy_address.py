"""The configured proxies' addresses: the one place a name is resolved without the check.

A proxy is the operator's own way out and often sits on a private network, so the
connection *to the proxy* is not held to the crawl's address policy. That trust belongs to
the proxy connection only, never to the name: were the name trusted by the resolver, a crawl
URL on the proxy's host (its admin port, an internal name equal to it) would skip the
private-address refusal, directly and through the proxy. So the proxy's name is resolved
here, unchecked, and aiohttp is handed the proxy URL with that address (an IP literal never
reaches a resolver); the guarded resolver then trusts no name at all.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from urllib.parse import urlsplit, urlunsplit

from aiohttp.abc import AbstractResolver

#: How long a proxy's resolved address is kept (as aiohttp's own DNS cache does).
PROXY_ADDRESS_TTL_S = 300.0


def with_host(url: str, ip: str) -> str:
    """``url`` with its host replaced by ``ip`` (credentials and port kept)."""
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    shown = f"[{ip}]" if ":" in ip else ip
    hostport = f"{shown}:{parts.port}" if parts.port else shown
    netloc = f"{userinfo}@{hostport}" if userinfo else hostport
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ProxyAddresses:
    """Proxy URLs by address, each name resolved with ``inner`` (no address check) and
    kept ``ttl_s``; an IPv4 answer is preferred (a proxy named ``localhost`` listening on
    127.0.0.1 only). Bounded by the configured proxies."""

    def __init__(self, inner: AbstractResolver, ttl_s: float = PROXY_ADDRESS_TTL_S) -> None:
        self._inner = inner
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[str, float]] = {}

    async def url(self, proxy: str) -> str:
        """``proxy`` with its host as an address (raises ``OSError`` if it resolves to none:
        a connection failure of the egress)."""
        host = urlsplit(proxy).hostname or ""
        if not host or _is_ip(host):
            return proxy
        hit = self._cache.get(proxy)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        port = urlsplit(proxy).port or 80
        answers = await self._inner.resolve(host, port, socket.AF_UNSPEC)
        if not answers:
            raise OSError(f"proxy host {host} has no address")
        ips = [str(a["host"]) for a in answers]
        ip = next((a for a in ips if ":" not in a), ips[0])
        resolved = with_host(proxy, ip)
        self._cache[proxy] = (resolved, now + self.ttl_s)
        return resolved
