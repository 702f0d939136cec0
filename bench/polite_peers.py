"""The polite Scrapy peer of ``bench.polite_bench``: Scrapy as a user configures it for a cap.

``bench.peers``' spider pins Scrapy to full speed (no delay, high per-domain concurrency) and
takes no settings, so this is its polite twin: the same CrawlSpider (robots obeyed, same-site
links followed, items discarded), with the settings Scrapy documents for politeness toward a
per-host cap of ``cap`` requests/s:

* ``ROBOTSTXT_OBEY = True``;
* ``DOWNLOAD_DELAY = 1 / cap`` with no jitter (``DOWNLOAD_DELAY_JITTER = 0``, Scrapy 2.19's
  spelling of ``RANDOMIZE_DOWNLOAD_DELAY = False``; the old setting is used where the new one
  does not exist);
* ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``: a download slot is per host name, so per host here;
* ``CONCURRENT_REQUESTS`` (16, Scrapy's default, unless told otherwise) across all hosts;
* AutoThrottle off, so the delay is exactly the configured one.

Runs in its own subprocess (``python -m bench.polite_peers scrapy ...``), like the peers of
``bench.peers``, and reports in the same JSON shape, so :class:`bench.peers.PeerResult` holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.peers import REPO_ROOT, USER_AGENT, PeerResult


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


# -- parent side -----------------------------------------------------------------------------------


def run_polite_scrapy(
    seeds: Sequence[str],
    allowed_hosts: Sequence[str],
    cap: float,
    concurrency: int = 16,
    timeout: float = 3600.0,
) -> PeerResult:
    """Crawl politely with Scrapy in a subprocess; see :func:`_scrapy_polite_crawl`."""
    with tempfile.TemporaryDirectory(prefix="bench-scrapy-polite-") as tmp:
        seeds_file = Path(tmp, "seeds.txt")
        seeds_file.write_text("\n".join(seeds) + "\n")
        out = Path(tmp, "result.json")
        cmd = [
            sys.executable,
            "-m",
            "bench.polite_peers",
            "scrapy",
            "--seeds-file",
            str(seeds_file),
            "--allowed-hosts",
            ",".join(allowed_hosts),
            "--cap",
            repr(cap),
            "--concurrency",
            str(concurrency),
            "--out",
            str(out),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        started = time.perf_counter()
        # Popen + os.wait4, as bench.peers does: the kernel's peak RSS of this one child.
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        returncode = os.waitstatus_to_exitcode(status)
        process_seconds = time.perf_counter() - started
        if returncode != 0:
            raise RuntimeError(f"polite scrapy exited with {returncode}: {' '.join(cmd)}")
        data = json.loads(out.read_text())
    pages = int(data["pages"])
    seconds = float(data["seconds"])
    return PeerResult(
        name=str(data["name"]),
        pages=pages,
        seconds=seconds,
        pages_per_s=pages / seconds if seconds > 0 else 0.0,
        peak_rss_mb=usage.ru_maxrss / 1024,  # KiB on Linux
        process_seconds=process_seconds,
        errors=int(data.get("errors", 0)),
        statuses={str(k): int(v) for k, v in data.get("statuses", {}).items()},
    )


# -- child -----------------------------------------------------------------------------------------


def _scrapy_polite_crawl(
    seeds: list[str], allowed_hosts: list[str], cap: float, concurrency: int
) -> dict[str, Any]:
    """bench.peers' CrawlSpider under :func:`scrapy_polite_settings`."""
    from scrapy import signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.http import Request, Response
    from scrapy.linkextractors import LinkExtractor
    from scrapy.spiders import CrawlSpider, Rule

    statuses: Counter[int] = Counter()
    clock: dict[str, float] = {}

    class PoliteSpider(CrawlSpider):
        name = "polite"
        allowed_domains = allowed_hosts  # OffsiteMiddleware matches host names, so IPs work
        start_urls = seeds
        rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

        async def start(self) -> AsyncIterator[Any]:
            # Filtered seeds, as in bench.peers: a seed linked from a page is fetched once.
            for url in seeds:
                yield Request(url)

        def parse_start_url(self, response: Response, **kwargs: Any) -> Any:
            return self.parse_page(response)

        def parse_page(self, response: Response) -> Iterator[dict[str, Any]]:
            statuses[response.status] += 1
            yield {
                "url": response.url,
                "title": response.css("title::text").get(),
                "text": " ".join(response.xpath("//body//text()").getall()),
                "links": [response.urljoin(h) for h in response.css("a::attr(href)").getall()],
            }

    process = CrawlerProcess(
        settings={
            **scrapy_polite_settings(cap, concurrency),
            "USER_AGENT": USER_AGENT,
            "HTTPCACHE_ENABLED": False,
            "HTTPERROR_ALLOW_ALL": True,  # count 404s as pages, as crawlfleet stores them
            "LOG_LEVEL": "ERROR",
            "TELNETCONSOLE_ENABLED": False,
            "ITEM_PIPELINES": {},
            "FEEDS": {},
            "LOG_INSTALL_ROOT_HANDLER": True,
        },
    )
    crawler = process.create_crawler(PoliteSpider)

    def opened(spider: Any) -> None:
        clock["start"] = time.perf_counter()

    def closed(spider: Any, reason: str) -> None:
        clock["end"] = time.perf_counter()

    crawler.signals.connect(opened, signal=signals.spider_opened)
    crawler.signals.connect(closed, signal=signals.spider_closed)
    process.crawl(crawler)
    process.start()
    stats = crawler.stats.get_stats() if crawler.stats else {}
    errors = int(stats.get("downloader/exception_count", 0)) - int(
        stats.get("downloader/exception_type_count/scrapy.exceptions.IgnoreRequest", 0)
    )
    return {
        "name": "scrapy (polite)",
        "pages": sum(statuses.values()),
        "seconds": clock.get("end", 0.0) - clock.get("start", 0.0),
        "errors": errors,
        "statuses": dict(statuses),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the polite Scrapy peer.")
    parser.add_argument("kind", choices=["scrapy"])
    parser.add_argument("--seeds-file", type=Path, required=True)
    parser.add_argument("--allowed-hosts", required=True, help="comma-separated host names/IPs")
    parser.add_argument("--cap", type=float, required=True, help="requests/s per host")
    parser.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS")
    parser.add_argument("--out", type=Path, help="write the result JSON here, else stdout")
    args = parser.parse_args(argv)
    if args.cap <= 0:
        parser.error("--cap must be > 0")
    seeds = [s.strip() for s in args.seeds_file.read_text().splitlines() if s.strip()]
    hosts = [h for h in args.allowed_hosts.split(",") if h]
    result = _scrapy_polite_crawl(seeds, hosts, args.cap, args.concurrency)
    result["self_peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    text = json.dumps(result)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
