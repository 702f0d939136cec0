"""Benchmark peers: what crawlfleet's throughput and memory are compared against.

* ``scrapy``: a CrawlSpider as a Scrapy user would write it (stock settings apart from
  concurrency, robots on, items discarded).
* ``bare``: the least a crawler can do in Python: an asyncio + aiohttp BFS loop with a
  ``set`` for dedupe, selectolax for links and protego for robots.txt, asking again after a
  429 or 503; the speed ceiling.

Each runs in its own subprocess (``python -m bench.peers KIND ...``) so its peak RSS is its
own and a crash or leak cannot skew the next run. Both do the same per-page work: read the
body, extract title, text and links, follow same-site links.
"""

from __future__ import annotations

import argparse
import asyncio
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[1]
USER_AGENT = "crawlfleet-bench"


@dataclass
class PeerResult:
    """One peer's run. ``seconds`` is crawl time (first request to last response); the
    interpreter start and imports are in ``process_seconds`` only, as crawlfleet's own summary
    times its crawl, not its start-up."""

    name: str
    pages: int
    seconds: float
    pages_per_s: float
    peak_rss_mb: float
    process_seconds: float = 0.0
    cpu_s: float = 0.0  # user + system CPU-seconds of every process it ran (broker included)
    errors: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


# -- parent side -----------------------------------------------------------------------------------


def scrapy_speed_settings(concurrency: int, obey_robots: bool = True) -> dict[str, Any]:
    """Stock Scrapy but for what the throughput comparison must pin down."""
    return {
        "ROBOTSTXT_OBEY": obey_robots,
        "CONCURRENT_REQUESTS": concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency,
        "DOWNLOAD_DELAY": 0,
        "AUTOTHROTTLE_ENABLED": False,
    }


def run_scrapy(
    seeds: Sequence[str],
    allowed_hosts: Sequence[str],
    concurrency: int,
    obey_robots: bool = True,
    *,
    settings: dict[str, Any] | None = None,
    name: str = "scrapy",
    timeout: float = 3600.0,
) -> PeerResult:
    """Crawl with the Scrapy CrawlSpider in a subprocess; see :func:`_scrapy_crawl`.

    ``settings`` replace :func:`scrapy_speed_settings` (e.g. the polite benchmark's).
    """
    chosen = settings if settings is not None else scrapy_speed_settings(concurrency, obey_robots)
    extra = ["--settings-json", json.dumps(chosen), "--name", name]
    return _run_child("scrapy", seeds, allowed_hosts, concurrency, extra, timeout)


def run_bare_aiohttp(
    seeds: list[str], allowed_hosts: list[str], concurrency: int, host_interval: float = 0.0
) -> PeerResult:
    """Crawl with a bare asyncio + aiohttp loop in a subprocess; see :func:`_bare_crawl`.

    ``host_interval`` > 0 spaces its requests to each host that many seconds apart.
    """
    return _run_child("bare", seeds, allowed_hosts, concurrency, bare_args(host_interval))


def bare_args(host_interval: float = 0.0) -> list[str]:
    """Extra child arguments for the bare loop."""
    return ["--host-interval", f"{host_interval:g}"] if host_interval > 0 else []


def peer_command(
    kind: str,
    seeds_file: Path,
    allowed_hosts: Sequence[str],
    concurrency: int,
    out: Path,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of a peer child (``python -m bench.peers KIND ...``)."""
    return [
        sys.executable,
        "-m",
        "bench.peers",
        kind,
        "--seeds-file",
        str(seeds_file),
        "--allowed-hosts",
        ",".join(allowed_hosts),
        "--concurrency",
        str(concurrency),
        "--out",
        str(out),
        *extra,
    ]


def peer_env() -> dict[str, str]:
    """The environment of a peer child: this one, with the repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _run_child(
    kind: str,
    seeds: Sequence[str],
    allowed_hosts: Sequence[str],
    concurrency: int,
    extra: list[str],
    timeout: float = 3600.0,
) -> PeerResult:
    with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as tmp:
        seeds_file = Path(tmp, "seeds.txt")
        seeds_file.write_text("\n".join(seeds) + "\n")
        out = Path(tmp, "result.json")
        cmd = peer_command(kind, seeds_file, allowed_hosts, concurrency, out, extra)
        env = peer_env()
        started = time.perf_counter()
        # Popen + os.wait4 (not subprocess.run) gives this one child's own rusage, so its peak
        # RSS is measured by the kernel rather than by the child about itself.
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        process_seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} peer exited with {proc.returncode}: {' '.join(cmd)}")
        data = json.loads(out.read_text())
    pages = int(data["pages"])
    seconds = float(data["seconds"])
    return PeerResult(
        name=data["name"],
        pages=pages,
        seconds=seconds,
        pages_per_s=pages / seconds if seconds > 0 else 0.0,
        peak_rss_mb=usage.ru_maxrss / 1024,  # KiB on Linux
        process_seconds=process_seconds,
        cpu_s=usage.ru_utime + usage.ru_stime,
        errors=int(data.get("errors", 0)),
        statuses={str(k): int(v) for k, v in data.get("statuses", {}).items()},
    )


# -- child: Scrapy ---------------------------------------------------------------------------------


def _scrapy_crawl(
    seeds: list[str], allowed_hosts: list[str], settings: dict[str, Any], name: str
) -> dict[str, Any]:
    """A CrawlSpider as a Scrapy user writes it, under ``settings`` (+ the fixed ones below)."""
    from scrapy import signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.http import Request, Response
    from scrapy.linkextractors import LinkExtractor
    from scrapy.spiders import CrawlSpider, Rule

    statuses: Counter[int] = Counter()
    clock: dict[str, float] = {}

    class BenchSpider(CrawlSpider):
        name = "bench"
        allowed_domains = allowed_hosts  # OffsiteMiddleware matches host names, so IPs work
        start_urls = seeds
        rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

        async def start(self) -> AsyncIterator[Any]:
            # Stock start() sets dont_filter, so a seed linked from another page would be
            # fetched twice; filtered seeds keep every peer's page count equal to the site's.
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
            **settings,
            "USER_AGENT": USER_AGENT,
            "HTTPCACHE_ENABLED": False,
            "HTTPERROR_ALLOW_ALL": True,  # count 404s as pages, as the other peers do
            "LOG_LEVEL": "ERROR",
            "TELNETCONSOLE_ENABLED": False,
            "ITEM_PIPELINES": {},  # items are discarded: storage is not what is measured
            "FEEDS": {},
            "LOG_INSTALL_ROOT_HANDLER": True,
        },
    )
    crawler = process.create_crawler(BenchSpider)

    def opened(spider: Any) -> None:
        clock["start"] = time.perf_counter()

    def closed(spider: Any, reason: str) -> None:
        clock["end"] = time.perf_counter()

    crawler.signals.connect(opened, signal=signals.spider_opened)
    crawler.signals.connect(closed, signal=signals.spider_closed)
    process.crawl(crawler)
    process.start()
    stats = crawler.stats.get_stats() if crawler.stats else {}
    # IgnoreRequest is robots.txt saying no: obeyed, not failed
    errors = int(stats.get("downloader/exception_count", 0)) - int(
        stats.get("downloader/exception_type_count/scrapy.exceptions.IgnoreRequest", 0)
    )
    if os.environ.get("BENCH_DEBUG"):
        print({k: v for k, v in stats.items() if "exception" in k or "retry" in k}, file=sys.stderr)
    return {
        "name": name,
        "pages": sum(statuses.values()),
        "seconds": clock.get("end", 0.0) - clock.get("start", 0.0),
        "errors": errors,
        "statuses": dict(statuses),
    }


# -- child: bare aiohttp ---------------------------------------------------------------------------


#: how often the bare loop asks again after a 429 or 503, and the longest Retry-After it waits
_BARE_RETRIES = 3
_BARE_MAX_RETRY_AFTER_S = 10.0


async def _bare_crawl_async(
    seeds: list[str], allowed_hosts: list[str], concurrency: int, host_interval: float = 0.0
) -> dict[str, Any]:
    import aiohttp
    from protego import Protego
    from selectolax.lexbor import LexborHTMLParser

    allowed = set(allowed_hosts)
    seen: set[str] = set()
    queue: asyncio.Queue[str] = asyncio.Queue()
    robots: dict[str, asyncio.Task[Any]] = {}
    statuses: Counter[int] = Counter()
    errors = 0

    for s in seeds:
        url = urldefrag(s)[0]
        if url not in seen:
            seen.add(url)
            queue.put_nowait(url)

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {"User-Agent": USER_AGENT}
    next_slot: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    async def pace(origin: str) -> None:
        """Wait for ``origin``'s next request slot (``host_interval`` apart), if spaced."""
        if host_interval <= 0:
            return
        now = loop.time()
        at = max(now, next_slot.get(origin, now))
        next_slot[origin] = at + host_interval
        if at > now:
            await asyncio.sleep(at - now)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as http:

        async def fetch_robots(origin: str) -> Any:
            try:
                await pace(origin)
                async with http.get(origin + "/robots.txt") as r:
                    return Protego.parse(await r.text()) if r.status == 200 else None
            except aiohttp.ClientError:
                return None

        async def worker() -> None:
            nonlocal errors
            while True:
                url = await queue.get()
                try:
                    parts = urlsplit(url)
                    origin = f"{parts.scheme}://{parts.netloc}"
                    if origin not in robots:
                        robots[origin] = asyncio.ensure_future(fetch_robots(origin))
                    rp = await robots[origin]
                    if rp is not None and not rp.can_fetch(url, USER_AGENT):
                        continue
                    for attempt in range(_BARE_RETRIES + 1):
                        await pace(origin)
                        async with http.get(url) as resp:
                            body = await resp.read()
                            status = resp.status
                            ctype = resp.headers.get("Content-Type", "")
                            retry_after = resp.headers.get("Retry-After", "")
                        if status not in (429, 503) or attempt == _BARE_RETRIES:
                            break
                        # the least a crawler must do: ask again once the server says
                        delay = float(retry_after) if retry_after.isdigit() else 1.0
                        await asyncio.sleep(min(delay, _BARE_MAX_RETRY_AFTER_S))
                    statuses[status] += 1
                    if "html" not in ctype:
                        continue
                    tree = LexborHTMLParser(body)
                    title_node = tree.css_first("title")
                    _title = title_node.text() if title_node is not None else ""
                    _text = tree.body.text(separator=" ") if tree.body is not None else ""
                    for a in tree.css("a[href]"):
                        href = a.attributes.get("href")
                        if not href:
                            continue
                        link = urldefrag(urljoin(url, href))[0]
                        if link in seen or urlsplit(link).hostname not in allowed:
                            continue
                        if not link.startswith(("http://", "https://")):
                            continue
                        seen.add(link)
                        queue.put_nowait(link)
                except (TimeoutError, aiohttp.ClientError, UnicodeError, ValueError):
                    errors += 1
                finally:
                    queue.task_done()

        started = time.perf_counter()
        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await queue.join()
        elapsed = time.perf_counter() - started
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return {
        "name": "bare-aiohttp",
        "pages": sum(statuses.values()),
        "seconds": elapsed,
        "errors": errors,
        "statuses": dict(statuses),
    }


def _bare_crawl(
    seeds: list[str], allowed_hosts: list[str], concurrency: int, host_interval: float = 0.0
) -> dict[str, Any]:
    """The bare loop: fetch, parse, dedupe with a set, obey robots, ask again after a 429 or
    503 (Retry-After); nothing else. ``host_interval`` > 0 spaces requests per host."""
    return asyncio.run(_bare_crawl_async(seeds, allowed_hosts, concurrency, host_interval))


# -- child entry point -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run one benchmark peer crawl.")
    parser.add_argument("kind", choices=["scrapy", "bare"])
    parser.add_argument("--seeds-file", type=Path, required=True)
    parser.add_argument("--allowed-hosts", required=True, help="comma-separated host names/IPs")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--settings-json", help="Scrapy settings (JSON object)")
    parser.add_argument("--name", default="scrapy", help="name reported for this peer")
    parser.add_argument(
        "--host-interval", type=float, default=0.0, help="bare: seconds between requests per host"
    )
    parser.add_argument("--out", type=Path, help="write the result JSON here, else stdout")
    args = parser.parse_args(argv)
    seeds = [s.strip() for s in args.seeds_file.read_text().splitlines() if s.strip()]
    hosts = [h for h in args.allowed_hosts.split(",") if h]
    if args.kind == "scrapy":
        settings = (
            json.loads(args.settings_json)
            if args.settings_json
            else scrapy_speed_settings(args.concurrency)
        )
        result = _scrapy_crawl(seeds, hosts, settings, args.name)
    else:
        result = _bare_crawl(seeds, hosts, args.concurrency, args.host_interval)
    result["self_peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    text = json.dumps(result)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
