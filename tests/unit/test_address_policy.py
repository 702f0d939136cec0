"""The address policy (SSRF guard) and the resolver that applies it where aiohttp connects."""

from __future__ import annotations

import asyncio

import pytest

from consumers.fetch.resolver import GuardedResolver, StaticResolver
from core.config import load_settings
from core.errors import ConfigError, ForbiddenAddressError
from core.urls import AddressPolicy, address_is_public

#: Loopback, private and metadata addresses in the IPv6 forms that reach them.
DISGUISED = [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254 (cloud metadata)
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible (deprecated)
    "fe80::1%eth0",  # link-local with a zone
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
]


@pytest.mark.parametrize("ip", DISGUISED)
def test_disguised_non_public_addresses_are_refused(ip: str) -> None:
    assert not address_is_public(ip)
    with pytest.raises(ForbiddenAddressError, match="allow-hosts"):
        AddressPolicy().check("evil.test", ip)


@pytest.mark.parametrize("ip", ["8.8.8.8", "2001:4860:4860::8888", "64:ff9b::808:808",
                                "2002:808:808::1", "::ffff:8.8.8.8"])
def test_public_addresses_in_any_form_pass(ip: str) -> None:
    assert address_is_public(ip)
    AddressPolicy().check("ok.test", ip)


def test_allow_hosts_by_network_by_ip_and_by_name() -> None:
    policy = AddressPolicy.of(False, ("127.0.0.2/32", "10.1.0.0/16", "intranet.corp", "::1"))
    assert policy.allows("a.test", "127.0.0.2")
    assert not policy.allows("a.test", "127.0.0.3")
    assert policy.allows("a.test", "10.1.2.3") and not policy.allows("a.test", "10.2.0.1")
    assert policy.allows("a.test", "::1")
    assert policy.allows("INTRANET.corp.", "192.168.0.9")  # any address of a named host
    assert policy.allows("a.test", "64:ff9b::a01:203")  # NAT64 of an allowed 10.1.2.3
    assert not policy.allows("a.test", "not an ip")


def test_allow_private_allows_everything() -> None:
    assert AddressPolicy.of(True).allows("x", "127.0.0.1")


def test_allow_hosts_setting_is_validated() -> None:
    s = load_settings(allow_hosts="127.0.0.1/8, intranet.corp")
    assert s.allow_hosts == ("127.0.0.1/8", "intranet.corp")
    for bad in ("1.2.3.4/99", "http://x", "a b"):
        with pytest.raises(ConfigError, match="allow_hosts"):
            load_settings(allow_hosts=bad)


def test_resolver_filters_each_answer_and_refuses_when_none_is_left() -> None:
    """DNS rebinding: the same name, public first and loopback next, is refused the second
    time, at resolution for the connection itself (there is no separate, cached check)."""
    stub = StaticResolver({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]],
                           "mixed.test": [["127.0.0.1", "93.184.216.34", "::1"]]})
    guard = GuardedResolver(AddressPolicy(), stub)

    async def run() -> None:
        first = await guard.resolve("rebind.test", 80)
        assert [a["host"] for a in first] == ["93.184.216.34"]
        with pytest.raises(ForbiddenAddressError, match=r"rebind\.test"):
            await guard.resolve("rebind.test", 80)
        mixed = await guard.resolve("mixed.test", 80)
        assert [a["host"] for a in mixed] == ["93.184.216.34"]  # never the loopback ones
        await guard.close()

    asyncio.run(run())
    assert guard.refused == 3
