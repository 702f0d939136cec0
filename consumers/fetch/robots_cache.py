"""The fetch stage's robots.txt cache: one fetch per origin and TTL, shared by its jobs.

Rules are cached per origin and evaluated per robots token (protego matches the token at
query time), so every profile reads the same file with its own ``User-agent`` group. The
file is fetched with the User-Agent (and through the egress) of the profile whose job asked
first, never with cookies. A target's Crawl-delay / Request-rate floor is the strictest the
file sets for the tokens of the profiles allowed on it (the target has one rate).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import aiohttp

from consumers.fetch.http import Fetcher, Identity
from consumers.fetch.robots import (
    MAX_ROBOTS_BYTES,
    UNREACHABLE_RETRY_S,
    RobotsRules,
    refused_rules,
    rules_from_response,
    target_interval,
)
from core.errors import (
    CrawlfleetError,
    ForbiddenAddressError,
    ForbiddenRedirectError,
)
from core.urls import origin_of


class RobotsCache:
    """Rules per origin; ``on_rules(target, min_interval_s)`` hears each fetched file's
    Crawl-delay / Request-rate, so the target's interval can honour it. ``tokens_for``
    names the robots tokens of the profiles allowed on a target (default: ``agent``)."""

    def __init__(self, agent: str, ttl_s: float,
                 on_rules: Callable[[str, float], None], max_origins: int = 1 << 30,
                 tokens_for: Callable[[str], Iterable[str]] | None = None) -> None:
        self.agent = agent
        self.tokens_for = tokens_for or (lambda target: (agent,))
        self.ttl_s = ttl_s
        self.on_rules = on_rules
        self.max_origins = max_origins
        self.fetcher: Fetcher | None = None
        self.fetched = 0
        self.peak = 0  # the most origins' rules held at once (high-water mark)
        self._rules: dict[str, RobotsRules] = {}  # oldest fetched first
        self._expiry: dict[str, float] = {}
        self._target: dict[str, str] = {}  # origin -> the target it was fetched for
        self._origins: dict[str, set[str]] = {}  # target -> its origins with rules here
        self._pending: dict[str, asyncio.Future[RobotsRules]] = {}

    def __len__(self) -> int:
        return len(self._rules)

    def forget_target(self, target: str) -> None:
        """Drop the rules of ``target``'s origins (the target itself was forgotten: its next
        job fetches robots.txt again, which sets its Crawl-delay again before it goes on).
        Unreachable and refused ones stay until they expire: they carry no Crawl-delay, and
        dropping them would ask that origin again before its retry time."""
        for origin in list(self._origins.get(target, ())):
            if not self._rules[origin].unreachable:
                self._drop(origin)

    def _drop(self, origin: str) -> None:
        self._rules.pop(origin, None)
        self._expiry.pop(origin, None)
        target = self._target.pop(origin, None)
        if target is not None:
            origins = self._origins.get(target)
            if origins is not None:
                origins.discard(origin)
                if not origins:
                    del self._origins[target]

    def _room(self) -> None:
        """Room for one more origin within ``max_origins``: the oldest fetched go first
        (O(1) each: rules are kept in fetch order, and with one TTL the oldest fetched
        expire first too)."""
        while self._rules and len(self._rules) >= self.max_origins:
            self._drop(next(iter(self._rules)))

    def known(self, url: str) -> RobotsRules | None:
        """Rules already cached for the URL's origin (even if due for a refresh)."""
        return self._rules.get(origin_of(url))

    def fresh(self, url: str) -> bool:
        """Whether :meth:`rules_for` answers ``url`` from the cache, asking nothing."""
        origin = origin_of(url)
        return origin in self._rules and self._expiry.get(origin, 0) > time.monotonic()

    async def rules_for(self, url: str, target: str,
                        identity: Identity | None = None) -> RobotsRules | None:
        """Cached rules for the URL's origin; None means "fetched them just now, requeue"
        (that request was the target's slot, sent as ``identity``: its User-Agent and
        egress, never its cookies). Raises :class:`ForbiddenAddressError` for an origin
        the address policy refuses: no retry can help that job."""
        origin = origin_of(url)
        rules = self._rules.get(origin)
        if rules is not None and self._expiry.get(origin, 0) > time.monotonic():
            if rules.refused is not None:
                raise ForbiddenAddressError(rules.refused)
            return rules
        pending = self._pending.get(origin)
        if pending is not None:
            await asyncio.shield(pending)
            return None
        fut: asyncio.Future[RobotsRules] = asyncio.get_running_loop().create_future()
        self._pending[origin] = fut
        try:
            rules = await self._fetch(origin, identity)
            self._drop(origin)  # re-inserted: the newest
            self._room()  # the bound holds at insertion
            self._rules[origin] = rules
            self._target[origin] = target
            self._origins.setdefault(target, set()).add(origin)
            ttl = UNREACHABLE_RETRY_S if rules.unreachable else self.ttl_s
            self._expiry[origin] = time.monotonic() + ttl
            self.peak = max(self.peak, len(self._rules))
            self.on_rules(target, target_interval(rules, self.tokens_for(target)))
            fut.set_result(rules)
        finally:
            del self._pending[origin]
            if not fut.done():
                fut.cancel()
        self.fetched += 1
        if rules.refused is not None:
            raise ForbiddenAddressError(rules.refused)
        return None

    async def _fetch(self, origin: str, identity: Identity | None = None) -> RobotsRules:
        """Rules from the origin's robots.txt. Refused only if the origin's own address is:
        an allowed origin whose robots.txt redirects to a refused address has a robots.txt
        that cannot be fetched, i.e. unreachable (RFC 9309 §2.3.1.4: disallow all, try
        again later), and its jobs end ``robots_unreachable``, not ``address_not_allowed``."""
        assert self.fetcher is not None
        sent_as = None if identity is None else \
            Identity(identity.headers, None, identity.proxy)  # no cookies
        try:
            resp = await self.fetcher.get(origin + "/robots.txt", max_bytes=MAX_ROBOTS_BYTES,
                                          follow_redirects=True, truncate=True,
                                          identity=sent_as)
        except ForbiddenRedirectError:
            return rules_from_response(None, b"", self.agent)
        except ForbiddenAddressError as exc:
            return refused_rules(str(exc))
        except (CrawlfleetError, aiohttp.ClientError):
            return rules_from_response(None, b"", self.agent)
        return rules_from_response(resp.status, resp.body, self.agent)
