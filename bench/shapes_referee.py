"""The referee of the shapes benchmark: what the site's request log says about one crawl.

Every expected page answered exactly once with its final status (a 429 or 503 is a deferral,
asked again), nothing robots.txt disallows requested: checked from the server's side, where
a crawler cannot fake it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protego import Protego

from sites.site_spec import USER_AGENT, SiteSpec, canonical_url

DEFERRED = (429, 503)  # answers that tell a crawler to ask again, not pages

LogEntry = tuple[float, str, str, int]  # (monotonic time, host, path?query, status)


class Robots:
    """robots.txt verdicts of the site, per host, as the expectation applies them."""

    def __init__(self, spec: SiteSpec) -> None:
        self._parsers = {
            h: Protego.parse(r) for h in spec.hosts if (r := spec.robots_txt(h)) is not None
        }

    def disallows(self, host: str, url: str) -> bool:
        rp = self._parsers.get(host)
        return rp is not None and not rp.can_fetch(url, USER_AGENT)


@dataclass
class Referee:
    """What the site's log says about one crawl."""

    expected: int
    served: int  # distinct expected URLs answered with a final status
    refetched: int  # final answers beyond the first for the same URL
    unexpected: int  # final answers for URLs outside the expected set
    disallowed: int  # requests for URLs robots.txt disallows
    deferred: int  # 429/503 answers (the crawler must ask again)
    robots: int
    requests: int
    window_s: float  # the site's first request to its last

    @property
    def exact(self) -> bool:
        return (
            self.served == self.expected
            and self.refetched == 0
            and self.unexpected == 0
            and self.disallowed == 0
        )


def referee(
    spec: SiteSpec,
    expected: Mapping[str, int] | set[str],
    log: Sequence[LogEntry],
    robots: Robots | None = None,
) -> Referee:
    """Check a crawl's requests against the URLs a correct crawler fetches, once each."""
    robots = robots or Robots(spec)
    finals: Counter[str] = Counter()
    n_robots = deferred = disallowed = 0
    for _, host, raw, status in log:
        if raw.partition("?")[0] == "/robots.txt":
            n_robots += 1
            continue
        url = canonical_url(spec.url(host, raw))
        if robots.disallows(host, url):
            disallowed += 1
        if status in DEFERRED:
            deferred += 1
        else:
            finals[url] += 1
    return Referee(
        expected=len(expected),
        served=sum(1 for u in finals if u in expected),
        refetched=sum(n - 1 for n in finals.values()),
        unexpected=sum(1 for u in finals if u not in expected),
        disallowed=disallowed,
        deferred=deferred,
        robots=n_robots,
        requests=len(log),
        window_s=log[-1][0] - log[0][0] if log else 0.0,
    )
