"""Publish seeds to the frontier: parse lines, canonicalise, derive targets, drop repeats.

Lines are plain URLs or JSON objects (``url``, optional ``profile``, ``pinned``,
``priority``, ``meta``). A bad line is reported with its number and reason and the rest still
go through. Repeats within the input are dropped here; repeats of pages already crawled are
dropped by the fetch stage, which owns the target's dedupe state.

Pinned or not: a line that names a profile (or every line, with ``publish --profile``) is
*pinned* to it -- only ever sent as that identity, deduplicated on ``profile|URL``. A line
naming none is *unpinned* when profiles are configured: its ``profile`` is
``default_profile``, only the placement's starting point, and its key is ``*|URL``; with no
profiles configured it is pinned to the implicit default profile (keys as before profiles).
An explicit ``"pinned": true|false`` wins. A profile this configuration does not know is
published all the same (the workers may be configured otherwise) and counted, for one
warning.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from core.config import Settings
from core.errors import ConfigError, CrawlfleetError, InvalidURLError, KafkaStageError
from core.profiles import valid_name
from core.urls import canonicalize, target_of
from infra.topics import missing_topics, topology_of
from schemas.keys import page_key
from schemas.lineage import ENQUEUED, lineage_event
from schemas.records import CrawlJob
from streams.backpressure import FrontierGate
from streams.io import Encoder, Output, connected_producer, producer_conf


@dataclass
class PublishReport:
    published: int = 0
    duplicates: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    waited_s: float = 0.0  # time spent blocked on a full frontier
    #: Lines published with a profile the publisher's configuration does not know, by name.
    unknown_profiles: dict[str, int] = field(default_factory=dict)

    def profile_warning(self) -> str | None:
        """The one warning about :attr:`unknown_profiles` (None when every profile is known)."""
        if not self.unknown_profiles:
            return None
        n = sum(self.unknown_profiles.values())
        names = ", ".join(f"{k} ({v})" for k, v in sorted(self.unknown_profiles.items()))
        return (f"{n} line{'s' if n > 1 else ''} published with a profile this "
                f"configuration does not know: {names}; a fetch worker that does not know it "
                "either dead-letters the job as unknown_profile")


def parse_line(line: str, settings: Settings, profile: str | None = None,
               kind: str = "page") -> CrawlJob | None:
    """One input line → a CrawlJob dict (None for blank/comment lines).

    ``profile`` (``publish --profile``) pins every line that names none to it; ``kind``
    ``sitemap`` (``publish --sitemap``) makes it a sitemap to expand.
    """
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    named, priority, meta = profile or "", 0, {}
    pinned: bool | None = None
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidURLError(f"bad JSON: {exc.msg}") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("url"), str):
            raise InvalidURLError("JSON line needs a string 'url'")
        text = obj["url"]
        named = str(obj.get("profile") or named)
        if "pinned" in obj:
            if not isinstance(obj["pinned"], bool):
                raise InvalidURLError("'pinned' must be true or false")
            pinned = obj["pinned"]
        try:
            priority = int(obj.get("priority", 0))
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: Infinity, 1e999
            raise InvalidURLError("'priority' must be an integer") from exc
        raw_meta = obj.get("meta") or {}
        if not isinstance(raw_meta, dict):
            raise InvalidURLError("'meta' must be an object")
        meta = {str(k): str(v) for k, v in raw_meta.items()}
    elif "://" in text.split()[0] and len(text.split()) > 1:
        # "http://a/ check this" is no URL: percent-encoding the words would fetch a page
        # nobody asked for. A URL with a real space in it is written %20 (or as JSON).
        raise InvalidURLError(f"not one URL (words after it?): {text[:80]!r}; a line "
                              "holds one URL, or one JSON object, and nothing else")
    if named and not valid_name(named):
        raise InvalidURLError(f"profile {named[:64]!r} is not a profile name (letters, digits, "
                              "'.', '_' or '-')")
    url = canonicalize(text)
    return {"url": url, "target": target_of(url, settings.target_mode),
            "profile": named or settings.default_profile,
            "depth": 0, "attempt": 0, "parent_url": None, "last_error": None,
            "priority": max(0, min(priority, 1)), "meta": meta, "delay_ms": 0,
            "pinned": _pinned(named, pinned, settings), "kind": kind, "visit": 0,
            "validators": {}}


def _pinned(named: str, explicit: bool | None, settings: Settings) -> bool:
    """Whether a line's job is pinned: as the line says; else when it names a profile, or
    when no profiles are configured (the implicit default profile is then the only identity:
    such jobs keep the ``profile|URL`` key every crawl before profiles had, so a crawl kept
    from then and resumed, or seeds republished into it, are never fetched again)."""
    if explicit is not None:
        return explicit
    return bool(named) or not settings.profiles


def jobs_from_lines(lines: Iterable[str], settings: Settings, report: PublishReport,
                    profile: str | None = None, kind: str = "page") -> Iterator[CrawlJob]:
    seen: set[str] = set()
    known = settings.profile_table
    for number, line in enumerate(lines, start=1):
        try:
            job = parse_line(line, settings, profile, kind)
        except CrawlfleetError as exc:
            report.errors.append((number, str(exc)))
            continue
        if job is None:
            continue
        key = page_key(job)  # by job type: two pins of one URL are two jobs, unpinned one
        if key in seen:
            report.duplicates += 1
            continue
        seen.add(key)
        if job["profile"] not in known:
            report.unknown_profiles[job["profile"]] = \
                report.unknown_profiles.get(job["profile"], 0) + 1
        yield job


class TopicsMissingError(ConfigError):
    """The topics a publisher writes do not exist: nothing was sent. ``report`` still holds
    the input's bad lines, so fixing the topics and the input is one round, not two."""

    def __init__(self, message: str, report: PublishReport) -> None:
        super().__init__(message)
        self.report = report


def publish(lines: Iterable[str], settings: Settings,
            profile: str | None = None, frontier_empty: bool = False,
            kind: str = "page") -> PublishReport:
    """Publish every good line to the frontier (idempotent producer, acks=all); ``profile``
    pins the lines that name none (:func:`parse_line`); ``kind`` ``sitemap`` publishes
    them as sitemaps (expanded by the parse stage). ``frontier_empty``: the caller has
    just made the frontier topics (a one-off crawl), so the frontier gate knows its lag
    without asking the broker for the first second.

    Topics that do not exist are found before anything is sent (a producer would otherwise
    wait out its delivery timeout on them): :class:`TopicsMissingError`, with the bad lines.
    """
    report = PublishReport()
    topology = topology_of(settings)
    missing = missing_topics(settings, [topology.frontier, topology.frontier_high,
                                        topology.lineage])
    if missing:
        for _ in jobs_from_lines(lines, settings, report, profile, kind):
            pass  # validate every line all the same: the report names the bad ones
        raise TopicsMissingError(
            f"topic{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"{'do' if len(missing) > 1 else 'does'} not exist on Kafka at "
            f"{settings.bootstrap_servers}: nothing was published; create the crawl topics "
            "with `crawlfleet topics create` (with the same --topic-prefix) and publish again",
            report)
    encoder = Encoder(topology, "publisher")
    producer = connected_producer(producer_conf(settings, "crawlfleet-publisher"))
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    gate = FrontierGate(settings, known_lag=0 if frontier_empty else None)
    try:
        for job in jobs_from_lines(lines, settings, report, profile, kind):
            if gate.over():  # the frontier is full: wait for fetching to catch up
                producer.flush(30)
                report.waited_s += gate.wait()
            elif report.published % 1000 == 0 and gate.due():
                producer.flush(30)  # the lag it reads next must count what was sent
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
