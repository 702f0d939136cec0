"""The fetch stage's resolver: every resolved address is checked before aiohttp uses it.

The address check sits where the connection is made, so a name that resolves to a public
address when checked and to loopback when connected (DNS rebinding) cannot slip through:
aiohttp's connector only ever sees the addresses this resolver returns, for every hop and
every fresh resolution. IP literals skip resolvers in aiohttp; :class:`Fetcher` checks
those itself with the same policy. A proxied request never reaches the connector's
resolution for its target: :class:`Fetcher` resolves the target through this resolver
itself and hands the proxy the checked address. No name is trusted here: a configured
proxy's own name is resolved for the connection to the proxy alone, apart
(:mod:`consumers.fetch.proxy_address`), so a crawl URL naming the proxy's host is refused
like any other private address.
"""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from core.errors import ForbiddenAddressError
from core.urls import AddressPolicy, refusal_message


class GuardedResolver(AbstractResolver):
    """Wraps a resolver; drops addresses the policy refuses, fails if none is left."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._inner = inner if inner is not None else DefaultResolver()
        self.refused = 0  # addresses dropped so far (a counter for status and tests)

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        allowed = [a for a in answers if self.policy.allows(host, str(a["host"]))]
        self.refused += len(answers) - len(allowed)
        if not allowed:
            ip = str(answers[0]["host"]) if answers else "no address"
            raise ForbiddenAddressError(refusal_message(host, ip))
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class StaticResolver(AbstractResolver):
    """Answers from a table: ``{host: [ip, ...]}`` per call in turn (the last one repeats).

    For tests and local fixtures only: it lets a test give a name one address first and
    another next, as a rebinding DNS server would, without any real DNS.
    """

    def __init__(self, table: dict[str, list[list[str]]]) -> None:
        self.table = table
        self.calls: dict[str, int] = {}

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        turns = self.table.get(host)
        if not turns:
            raise OSError(f"{host}: no such host in the static table")
        n = self.calls.get(host, 0)
        self.calls[host] = n + 1
        ips = turns[min(n, len(turns) - 1)]
        return [_result(host, ip, port) for ip in ips]

    async def close(self) -> None:
        return


def _result(host: str, ip: str, port: int) -> ResolveResult:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    return ResolveResult(hostname=host, host=ip, port=port, family=family, proto=0,
                         flags=socket.AI_NUMERICHOST)
