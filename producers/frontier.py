"""Publish seeds to the frontier: parse lines, canonicalise, derive targets, drop repeats.

Lines are plain URLs or JSON objects (``url``, optional ``profile``, ``priority``,
``meta``). A bad line is reported with its number and reason and the rest still go
through. Repeats within the input are dropped here; repeats of pages already crawled are
dropped by the fetch stage, which owns the target's dedupe state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from core.config import Settings
from core.errors import ConfigError, CrawlfleetError, InvalidURLError, KafkaStageError
from core.urls import canonicalize, dedupe_key, target_of
from infra.topics import missing_topics, topology_of
from producers.lineage import ENQUEUED, lineage_event
from schemas.records import CrawlJob
from streams.backpressure import FrontierGate
from streams.io import Encoder, Output, producer_conf


@dataclass
class PublishReport:
    published: int = 0
    duplicates: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    waited_s: float = 0.0  # time spent blocked on a full frontier


def parse_line(line: str, settings: Settings) -> CrawlJob | None:
    """One input line → a CrawlJob dict (None for blank/comment lines)."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    profile, priority, meta = settings.default_profile, 0, {}
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidURLError(f"bad JSON: {exc.msg}") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("url"), str):
            raise InvalidURLError("JSON line needs a string 'url'")
        text = obj["url"]
        profile = str(obj.get("profile") or profile)
        try:
            priority = int(obj.get("priority", 0))
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: Infinity, 1e999
            raise InvalidURLError("'priority' must be an integer") from exc
        raw_meta = obj.get("meta") or {}
        if not isinstance(raw_meta, dict):
            raise InvalidURLError("'meta' must be an object")
        meta = {str(k): str(v) for k, v in raw_meta.items()}
    url = canonicalize(text)
    return {"url": url, "target": target_of(url, settings.target_mode), "profile": profile,
            "depth": 0, "attempt": 0, "parent_url": None, "last_error": None,
            "priority": max(0, min(priority, 1)), "meta": meta, "delay_ms": 0}


def jobs_from_lines(lines: Iterable[str], settings: Settings,
                    report: PublishReport) -> Iterator[CrawlJob]:
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        try:
            job = parse_line(line, settings)
        except CrawlfleetError as exc:
            report.errors.append((number, str(exc)))
            continue
        if job is None:
            continue
        key = dedupe_key(job["profile"], job["url"])
        if key in seen:
            report.duplicates += 1
            continue
        seen.add(key)
        yield job


class TopicsMissingError(ConfigError):
    """The topics a publisher writes do not exist: nothing was sent. ``report`` still holds
    the input's bad lines, so fixing the topics and the input is one round, not two."""

    def __init__(self, message: str, report: PublishReport) -> None:
        super().__init__(message)
        self.report = report


def publish(lines: Iterable[str], settings: Settings) -> PublishReport:
    """Publish every good line to the frontier (idempotent producer, acks=all).

    Topics that do not exist are found before anything is sent (a producer would otherwise
    wait out its delivery timeout on them): :class:`TopicsMissingError`, with the bad lines.
    """
    report = PublishReport()
    topology = topology_of(settings)
    missing = missing_topics(settings, [topology.frontier, topology.frontier_high,
                                        topology.lineage])
    if missing:
        for _ in jobs_from_lines(lines, settings, report):
            pass  # validate every line all the same: the report names the bad ones
        raise TopicsMissingError(
            f"topic{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"{'do' if len(missing) > 1 else 'does'} not exist on Kafka at "
            f"{settings.bootstrap_servers}: nothing was published; create the crawl topics "
            "with `crawlfleet topics create` (with the same --topic-prefix) and publish again",
            report)
    encoder = Encoder(topology, "publisher")
    producer = Producer(producer_conf(settings, "crawlfleet-publisher"))
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    gate = FrontierGate(settings)
    try:
        for job in jobs_from_lines(lines, settings, report):
            if gate.over():  # the frontier is full: wait for fetching to catch up
                producer.flush(30)
                report.waited_s += gate.wait()
            elif report.published % 1000 == 0:
                producer.flush(30)
                gate.refresh()
            topic = topology.frontier_high if job["priority"] > 0 else topology.frontier
            for out in (encoder.job(topic, job),
                        lineage_event(encoder, job, ENQUEUED, "publish", "seed")):
                produce_patiently(producer, out, on_delivery)
            report.published += 1
            gate.add(1)
            producer.poll(0)
    except KafkaException as exc:
        raise KafkaStageError(f"publishing failed: {exc}") from exc
    finally:
        remaining = producer.flush(30)
        gate.close()
    if remaining or failures:
        raise KafkaStageError(f"{remaining} undelivered, {len(failures)} failed: "
                              f"{failures[:3]}")
    return report


def produce_patiently(producer: Producer, out: Output,
                      on_delivery: Callable[[KafkaError | None, Message], None]) -> None:
    """Produce ``out``, serving deliveries while the producer's queue is full."""
    while True:
        try:
            producer.produce(out.topic, value=out.value, key=out.key, partition=out.partition,
                             headers=out.headers, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.1)
