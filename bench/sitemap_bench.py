"""Sitemap expansion benchmark (issue 45): a sitemap index of 500k URLs, ours beside peers.

    python -m bench.sitemap_bench [--urls 500000] [--per-sitemap 50000]
                                  [--impls crawlfleet,crawlfleet-records,usp,scrapy]
                                  [--json-out bench/out/sitemap_bench.json]

The parent writes one index listing ``urls / per-sitemap`` gzip sitemaps (``.xml.gz``, each
URL with a ``lastmod``, as large sites publish them) and runs each implementation in its
own subprocess, so no one's memory is in another's figures. Each reads the compressed
documents from memory (no network), expands the index and every sitemap it lists, and
reports the URLs it got, wall and CPU seconds, URLs/s, its peak RSS (VmHWM) and the growth
over its baseline (VmRSS after imports and loading the compressed files).

- ``crawlfleet``: :func:`consumers.sitemaps.expand` per document (the parse stage's pure
  expansion: inflate within the cap, guards, usp's parse, every URL's rules, the jobs);
- ``crawlfleet-records``: :class:`consumers.sitemaps.SitemapStep` per listed sitemap, the
  jobs encoded as the parse stage publishes them (a frontier record and its lineage each);
- ``usp``: ultimate-sitemap-parser's own tree walk (``SitemapFetcher`` from the index with
  a web client serving the same bytes), counting ``all_pages()``;
- ``scrapy``: Scrapy's ``SitemapSpider`` parsing (``scrapy.utils.sitemap.Sitemap`` over
  ``scrapy.utils.gz.gunzip``), without building requests (if Scrapy is installed:
  ``make bench`` installs it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

IMPLS = ("crawlfleet", "crawlfleet-records", "usp", "scrapy")
HOST = "https://bench.example"
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def write_documents(folder: Path, urls: int, per_sitemap: int) -> None:
    """``index.xml`` listing the gzip sitemaps ``s<n>.xml.gz`` of ``urls`` pages."""
    names = []
    for n, start in enumerate(range(0, urls, per_sitemap)):
        body = "".join(
            f"<url><loc>{HOST}/products/{i}/item-{i * 7919 % 100003}</loc>"
            f"<lastmod>2026-{1 + i % 12:02d}-{1 + i % 28:02d}T10:{i % 60:02d}:00+00:00"
            "</lastmod></url>" for i in range(start, min(urls, start + per_sitemap)))
        doc = f'<?xml version="1.0" encoding="UTF-8"?><urlset {NS}>{body}</urlset>'
        (folder / f"s{n}.xml.gz").write_bytes(gzip.compress(doc.encode(), 6))
        names.append(f"s{n}.xml.gz")
    index = "".join(f"<sitemap><loc>{HOST}/{name}</loc></sitemap>" for name in names)
    (folder / "index.xml").write_text(
        f'<?xml version="1.0" encoding="UTF-8"?><sitemapindex {NS}>{index}</sitemapindex>')


def _documents(folder: Path) -> dict[str, bytes]:
    return {f"{HOST}/{p.name}": p.read_bytes() for p in sorted(folder.iterdir())}


def _job(url: str, depth: int) -> Any:
    return {"url": url, "target": "bench.example", "profile": "default", "depth": 0,
            "attempt": 0, "parent_url": None, "last_error": None, "priority": 0,
            "meta": {"sitemap_depth": str(depth)}, "delay_ms": 0, "pinned": True,
            "kind": "sitemap", "visit": 0, "validators": {}}


def run_crawlfleet(docs: dict[str, bytes], per_sitemap: int, records: bool) -> int:
    from consumers.sitemaps import SitemapStep, UrlRules, expand
    from core.config import Settings
    from infra.topics import topology_of
    from streams.io import Encoder

    s = Settings(sitemap_max_urls=per_sitemap, partitions=12)
    rules = UrlRules.of(s)
    topo = topology_of(s)
    step = SitemapStep(s, Encoder(topo, "bench"), topo, lambda _n, _c: None)
    pending = [(f"{HOST}/index.xml", 0)]
    got = 0
    while pending:
        url, depth = pending.pop()
        job = _job(url, depth)
        if records and depth > 0:  # the parse stage's records of a leaf sitemap
            step.begin_batch()  # one transaction per sitemap
            outs = step.outputs({"job": job, "status": 200, "body": docs[url]},  # type: ignore[typeddict-item]
                                None)
            got += sum(1 for o in outs if o.topic == topo.frontier)
            continue
        found = expand(job, docs[url], s, rules)
        for child in found.jobs:
            if child["kind"] == "sitemap":
                pending.append((child["url"], depth + 1))
            else:
                got += 1
    return got


def run_usp(docs: dict[str, bytes]) -> int:
    from usp.fetch_parse import SitemapFetcher
    from usp.web_client.abstract_client import (
        AbstractWebClient,
        AbstractWebClientResponse,
        AbstractWebClientSuccessResponse,
    )

    class Answer(AbstractWebClientSuccessResponse):
        def __init__(self, url: str, data: bytes) -> None:
            self._url, self._data = url, data

        def status_code(self) -> int:
            return 200

        def status_message(self) -> str:
            return "OK"

        def header(self, case_insensitive_name: str) -> str | None:
            return None

        def raw_data(self) -> bytes:
            return self._data

        def url(self) -> str:
            return self._url

    class Memory(AbstractWebClient):
        def set_max_response_data_length(self, max_response_data_length: int | None) -> None:
            pass

        def get(self, url: str) -> AbstractWebClientResponse:
            return Answer(url, docs[url])

    tree = SitemapFetcher(f"{HOST}/index.xml", 0, web_client=Memory()).sitemap()
    return sum(1 for _ in tree.all_pages())


def run_scrapy(docs: dict[str, bytes]) -> int:
    from scrapy.utils.gz import gunzip
    from scrapy.utils.sitemap import Sitemap

    got = 0
    pending = [f"{HOST}/index.xml"]
    while pending:
        url = pending.pop()
        body = docs[url]
        tree = Sitemap(gunzip(body) if url.endswith(".gz") else body)
        for entry in tree:
            if tree.type == "sitemapindex":
                pending.append(entry["loc"])
            else:
                got += bool(entry["loc"]) and 1
    return got


def child(impl: str, folder: Path, per_sitemap: int) -> dict[str, Any]:
    docs = _documents(folder)
    if impl.startswith("crawlfleet"):
        import consumers.sitemaps  # noqa: F401 -- imports before the baseline
    base = _status_kb("VmRSS")
    t0, c0 = time.perf_counter(), os.times()
    if impl == "crawlfleet":
        got = run_crawlfleet(docs, per_sitemap, False)
    elif impl == "crawlfleet-records":
        got = run_crawlfleet(docs, per_sitemap, True)
    elif impl == "usp":
        got = run_usp(docs)
    else:
        got = run_scrapy(docs)
    wall = time.perf_counter() - t0
    c1 = os.times()
    peak = _status_kb("VmHWM")
    return {"impl": impl, "urls": got, "wall_s": round(wall, 2),
            "cpu_s": round(c1.user + c1.system - c0.user - c0.system, 2),
            "urls_per_s": round(got / wall), "peak_rss_mb": round(peak / 1024),
            "growth_mb": round((peak - base) / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--urls", type=int, default=500_000)
    ap.add_argument("--per-sitemap", type=int, default=50_000)
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dir, args.per_sitemap)))
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sitemap-bench-") as tmp:
        folder = Path(tmp)
        write_documents(folder, args.urls, args.per_sitemap)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"index of {args.urls} URLs in {len(list(folder.iterdir())) - 1} gzip "
              f"sitemaps, {size / 1e6:.1f} MB compressed")
        for impl in args.impls.split(","):
            if impl == "scrapy":
                try:
                    import scrapy  # noqa: F401
                except ImportError:
                    print("scrapy: not installed (make bench installs it), skipped")
                    continue
            out = subprocess.run([sys.executable, "-m", "bench.sitemap_bench", "--child", impl,
                                  "--dir", str(folder), "--per-sitemap", str(args.per_sitemap)],
                                 capture_output=True, text=True, check=False, timeout=1800)
            if out.returncode != 0:
                print(f"{impl}: failed\n{out.stderr[-2000:]}")
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print("  ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
