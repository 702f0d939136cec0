"""The broker's floor of a polite page: its CPU for one small transaction, with no crawler.

    python -m bench.txn_floor [--window 45] [--rate 2] [--port 28792]

A polite fleet hands each page on in a transaction per stage (fetch, parse) and the store
commits offsets after each write, so at 2 pages/s the broker runs ~4-6 small transactions a
second however lean the workers are. This measures what one costs the broker on this
machine, beside its idle floor: a bare broker (no client), the same broker with one idle
transactional producer and consumer connected, and that client running ``--rate``
transactions a second, each one ~12 KB record and its consumer offsets (as a stage's). The
difference, divided by the transactions, is the broker's CPU a transaction: multiplied by a
polite page's transactions, the share of "CPU a page above idle" no worker change can remove.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.idle_bench import sample
from bench.proc_costs import cpu_seconds
from infra import kafka_local


def _clients(bootstrap: str) -> tuple[Producer, Consumer]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic("floor.out", 12, 1),
                                    NewTopic("floor.in", 12, 1)]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "floor-1",
                         "linger.ms": 50, "enable.idempotence": True})
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "floor",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 500})
    consumer.assign([TopicPartition("floor.in", 0, 0)])
    return producer, consumer


def _transactions(producer: Producer, consumer: Consumer, rate: float, window_s: float,
                  offset: list[int]) -> int:
    """``rate`` transactions a second for ``window_s``, each a record and offsets."""
    body = os.urandom(6_000).hex().encode()  # ~12 KB, incompressible like a page's text
    n, start = 0, time.monotonic()
    while time.monotonic() - start < window_s:
        consumer.poll(0)
        producer.begin_transaction()
        producer.produce("floor.out", body, key=f"k{n}".encode(), partition=n % 12)
        offset[0] += 1
        producer.send_offsets_to_transaction(
            [TopicPartition("floor.in", 0, offset[0])], consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        n += 1
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--window", type=float, default=45.0)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=2.0, help="transactions a second")
    p.add_argument("--port", type=int, default=28792)
    args = p.parse_args(argv)
    os.environ.setdefault(kafka_local.JARS_ENV, str(kafka_local.ensure_jars()))
    with tempfile.TemporaryDirectory(prefix="crawlfleet-txn-") as tmp:
        home = Path(tmp) / "kafka"
        bootstrap = kafka_local.up(nodes=1, base_dir=home, base_port=args.port, heap_mb=512)
        broker = [n.pid for n in kafka_local.status(home).nodes if n.pid is not None]
        try:
            time.sleep(args.settle)
            bare = sum(sample(lambda: broker, args.window).values())
            producer, consumer = _clients(bootstrap)
            offset = [0]
            _transactions(producer, consumer, args.rate, 5.0, offset)  # warm
            time.sleep(args.settle)
            idle = sum(sample(lambda: broker, args.window).values())
            before = cpu_seconds(broker[0]) or 0.0
            n = _transactions(producer, consumer, args.rate, args.window, offset)
            busy_s = (cpu_seconds(broker[0]) or 0.0) - before
            consumer.close()
        finally:
            kafka_local.down(home)
    busy = busy_s * 60.0 / args.window
    per_txn = (busy - idle) * args.window / 60.0 / max(n, 1)
    print(f"load average {os.getloadavg()[0]:.1f}; window {args.window:.0f} s")
    print(f"bare broker                   {bare:6.2f} CPU-s/min")
    print(f"one idle txn client            {idle:6.2f} CPU-s/min")
    print(f"{n} transactions at {args.rate:g}/s      {busy:6.2f} CPU-s/min: "
          f"{per_txn * 1000:.1f} ms of broker CPU a transaction above the idle client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
