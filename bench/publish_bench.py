"""Publish benchmark: ``crawlfleet publish``'s rate beside a bare producer, same broker, one run.

Each round publishes N seed URLs over 50 hosts into a fresh topic namespace (created, then
deleted): once plain (``http://127.0.0.K:8080/p/I.html``), once with a query string each
(``...?sort=name&id=I&utm_source=x``: canonicalisation sorts the query's pairs). The peer
is a bare confluent-kafka producer sending the same number of records of the same size to
the same topic with the same delivery settings (idempotent, acks=all, lz4): the floor of
what publishing costs on this broker, with no parsing, canonicalisation, dedupe, Avro or
lineage.

    python -m bench.publish_bench [--urls 100000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from core.config import Settings, load_settings
from crawlfleet.reach import resolve_bootstrap
from infra.topics import create_topics, delete_topics, topology_of
from producers.frontier import publish
from streams.io import producer_conf

HOSTS = 50


def plain_urls(n: int) -> list[str]:
    return [f"http://127.0.0.{2 + i % HOSTS}:8080/p/{i}.html" for i in range(n)]


def query_urls(n: int) -> list[str]:
    return [f"http://127.0.0.{2 + i % HOSTS}:8080/list?sort=name&id={i}&utm_source=x"
            for i in range(n)]


def _namespace(settings: Settings, tag: str) -> Settings:
    s = settings.replace(topic_prefix=f"pb{int(time.time())}-{tag}-{os.getpid()}.",
                         partitions=4, allow_private=True)
    create_topics(s, fresh=True)
    return s


def run_publish(settings: Settings, urls: list[str]) -> float:
    """Seconds ``publish`` takes for ``urls`` (every one new) into a fresh namespace."""
    s = _namespace(settings, "cf")
    try:
        began = time.perf_counter()
        report = publish(urls, s)
        took = time.perf_counter() - began
        if report.published != len(urls):
            raise RuntimeError(f"published {report.published} of {len(urls)}")
        return took
    finally:
        delete_topics(s, topics=[t.name for t in topology_of(s).specs()])


def run_bare(settings: Settings, n: int, size: int) -> float:
    """Seconds a bare producer takes for ``n`` records of ``size`` bytes to one topic."""
    s = _namespace(settings, "bare")
    try:
        topic = topology_of(s).frontier
        producer = Producer(producer_conf(s, "publish-bench"))
        value = os.urandom(size)
        began = time.perf_counter()
        for i in range(n):
            while True:
                try:
                    producer.produce(topic, value, str(i).encode(), partition=i % 4)
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
        producer.flush(60)
        return time.perf_counter() - began
    finally:
        delete_topics(s, topics=[t.name for t in topology_of(s).specs()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    console = Console()
    settings = resolve_bootstrap(load_settings(), start_local=True)
    table = Table(title=f"publish: {args.urls:,} new URLs over {HOSTS} hosts, median of "
                        f"{args.repeat} run(s)")
    for col in ("URLs", "crawlfleet publish URLs/s", "bare producer records/s",
                "publish / bare"):
        table.add_column(col, justify="right")
    shapes: dict[str, Callable[[int], list[str]]] = {"plain": plain_urls,
                                                     "with query": query_urls}
    for name, make in shapes.items():
        urls = make(args.urls)
        cf, bare = [], []
        for _ in range(args.repeat):
            cf.append(args.urls / run_publish(settings, urls))
            # the job record plus its lineage record, as publish sends them
            bare.append(2 * args.urls / run_bare(settings, 2 * args.urls, 120))
        cf_rate, bare_rate = sorted(cf)[len(cf) // 2], sorted(bare)[len(bare) // 2]
        console.print(f"{name}: crawlfleet {cf_rate:,.0f} URLs/s, bare {bare_rate:,.0f} "
                      "records/s")
        table.add_row(name, f"{cf_rate:,.0f}", f"{bare_rate:,.0f}",
                      f"{cf_rate * 2 / bare_rate:.2f}x of its records' floor")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
