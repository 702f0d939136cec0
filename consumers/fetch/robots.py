"""robots.txt decisions (RFC 9309), cached per origin with a TTL, evaluated per robots token.

2xx: parse the rules (the first 500 KiB of a larger file, RFC 9309 §2.5); 4xx: no rules,
allow all; 5xx, timeout or connection failure: the site is unreachable, so disallow for
now and try again later (a robots.txt that redirects to an address the policy refuses is
unreachable too: it cannot be fetched). An origin whose own address the policy refuses is
``refused``: its jobs are dead-lettered at once (``address_not_allowed``), never retried.
Crawl-delay and Request-rate are honoured by turning them into a minimum interval between
requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protego import Protego

UNREACHABLE_RETRY_S = 60.0
#: RFC 9309 §2.5: parse at least the first 500 KiB; the rest of a larger file is ignored.
MAX_ROBOTS_BYTES = 500 * 1024


@dataclass(frozen=True)
class RobotsRules:
    """What robots.txt says for one target, for our agent."""

    parser: Protego | None  # None: no rules (allow all) or unreachable (see ``unreachable``)
    unreachable: bool = False
    min_interval_s: float = 0.0
    refused: str | None = None  # the address policy refused the origin: why, and the fix

    def allows(self, url: str, agent: str) -> bool:
        """Whether ``agent`` (a profile's robots token: protego matches it at query time,
        so one cached file answers every profile) may fetch ``url``."""
        if self.unreachable:
            return False
        return self.parser is None or bool(self.parser.can_fetch(url, agent))

    def interval_for(self, agent: str) -> float:
        """Crawl-delay / Request-rate for ``agent`` as a minimum interval (0: none)."""
        return _min_interval(self.parser, agent) if self.parser is not None else 0.0


def target_interval(rules: RobotsRules, tokens: Iterable[str]) -> float:
    """A target's robots.txt floor: the strictest Crawl-delay / Request-rate the file sets
    for ``tokens`` (those of the profiles allowed on it: the target has one pace, so the
    most patient group any of them must obey holds for all); the file's answer for the
    worker's own agent when no profile is allowed there."""
    return max((rules.interval_for(t) for t in tokens), default=rules.min_interval_s)


def rules_from_response(status: int | None, body: bytes, agent: str) -> RobotsRules:
    """Turn the robots.txt fetch result into rules (``status`` None = no answer)."""
    if status is None or status >= 500 or status == 429:
        return RobotsRules(None, unreachable=True)
    if 400 <= status <= 499:
        return RobotsRules(None)
    if 200 <= status <= 299:
        text = body[:MAX_ROBOTS_BYTES].decode("utf-8", "replace")
        if len(body) >= MAX_ROBOTS_BYTES and "\n" in text:
            text = text[:text.rindex("\n")]  # a rule cut in half is no rule
        parser = Protego.parse(text)
        return RobotsRules(parser, min_interval_s=_min_interval(parser, agent))
    return RobotsRules(None)  # 1xx/3xx after redirects exhausted: treat as no rules


def refused_rules(why: str) -> RobotsRules:
    """Rules of an origin the address policy refuses: nothing there may be fetched."""
    return RobotsRules(None, unreachable=True, refused=why)


def _min_interval(parser: Protego, agent: str) -> float:
    interval = 0.0
    delay = parser.crawl_delay(agent)
    if delay:
        interval = float(delay)
    rate = parser.request_rate(agent)
    if rate and rate.requests:
        interval = max(interval, rate.seconds / rate.requests)
    return interval
