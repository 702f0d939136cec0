"""A proxy's name is resolved apart, for the connection to the proxy only: the URL handed to
aiohttp carries the address (credentials and port kept), an IP literal is left alone, and
the guarded resolver trusts no name (a crawl URL on the proxy's host is checked)."""

from __future__ import annotations

import asyncio

import pytest

from consumers.fetch.proxy_address import ProxyAddresses, with_host
from consumers.fetch.resolver import GuardedResolver, StaticResolver
from core.errors import ForbiddenAddressError
from core.urls import AddressPolicy


def test_with_host_keeps_credentials_and_port() -> None:
    assert with_host("http://u:p@proxy.test:3128", "10.0.0.5") == "http://u:p@10.0.0.5:3128"
    assert with_host("http://proxy.test", "::1") == "http://[::1]"


def test_a_named_proxy_is_handed_over_by_address_an_ipv4_one_first() -> None:
    resolver = StaticResolver({"proxy.test": [["::1", "127.0.0.1"]]})
    proxies = ProxyAddresses(resolver)

    async def body() -> list[str]:
        return [await proxies.url("http://u:p@proxy.test:3128"),
                await proxies.url("http://u:p@proxy.test:3128"),
                await proxies.url("http://127.0.0.9:8080")]

    assert asyncio.run(body()) == ["http://u:p@127.0.0.1:3128"] * 2 + ["http://127.0.0.9:8080"]
    assert resolver.calls == {"proxy.test": 1}  # kept for its TTL


def test_the_guarded_resolver_checks_a_name_a_proxy_also_has() -> None:
    guarded = GuardedResolver(AddressPolicy(False),
                              StaticResolver({"proxy.test": [["127.0.0.1"]]}))
    with pytest.raises(ForbiddenAddressError):
        asyncio.run(guarded.resolve("proxy.test", 80))
