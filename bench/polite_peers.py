"""The polite Scrapy peer of ``bench.polite_bench``: Scrapy as a user configures it for a cap.

The same CrawlSpider as ``bench.peers`` (robots obeyed, same-site links followed, items
discarded), under the settings Scrapy documents for politeness toward a per-host cap of ``cap``
requests/s:

* ``ROBOTSTXT_OBEY = True``;
* ``DOWNLOAD_DELAY = 1 / cap`` with no jitter (``DOWNLOAD_DELAY_JITTER = 0``, Scrapy 2.19's
  spelling of ``RANDOMIZE_DOWNLOAD_DELAY = False``; the old setting is used where the new one
  does not exist);
* ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``: a download slot is per host name, so per host here;
* ``CONCURRENT_REQUESTS`` (16, Scrapy's default, unless told otherwise) across all hosts;
* AutoThrottle off, so the delay is exactly the configured one.

It runs in its own subprocess through :func:`bench.peers.run_scrapy`, like every peer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.peers import PeerResult, run_scrapy


def scrapy_polite_settings(cap: float, concurrency: int) -> dict[str, Any]:
    """The settings that make Scrapy keep to ``cap`` requests/s per host, as documented."""
    from scrapy.settings import default_settings

    settings: dict[str, Any] = {
        "ROBOTSTXT_OBEY": True,
        "DOWNLOAD_DELAY": 1.0 / cap,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "CONCURRENT_REQUESTS": concurrency,
        "AUTOTHROTTLE_ENABLED": False,
    }
    if hasattr(default_settings, "DOWNLOAD_DELAY_JITTER"):
        settings["DOWNLOAD_DELAY_JITTER"] = 0.0  # RANDOMIZE_DOWNLOAD_DELAY is deprecated
    else:
        settings["RANDOMIZE_DOWNLOAD_DELAY"] = False
    return settings


def run_polite_scrapy(
    seeds: Sequence[str],
    allowed_hosts: Sequence[str],
    cap: float,
    concurrency: int = 16,
    timeout: float = 3600.0,
) -> PeerResult:
    """Crawl politely with Scrapy in a subprocess (bench.peers' spider, polite settings)."""
    if cap <= 0:
        raise ValueError("cap must be > 0")
    return run_scrapy(
        seeds,
        allowed_hosts,
        concurrency,
        settings=scrapy_polite_settings(cap, concurrency),
        name="scrapy (polite)",
        timeout=timeout,
    )
