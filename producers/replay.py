"""Replaying dead letters: the replay mark, its dedupe key, and the replay publisher.

A replayed job is its dead letter's job with fresh attempts and a *replay id* in its meta
(:data:`REPLAY_META`): a hash of the dead letter's id (``topic:partition:offset`` of its
``crawl.dead`` record). Its dedupe key is the page's key plus that id
(:func:`job_dedupe_key`), so

- the fetch stage does not suppress it because the page's own key is ``DEAD``;
- a second replay of the same dead letter carries the same id, hence the same key, which
  the first replay made ``DONE`` (or holds while it is in flight): it is suppressed, and
  replaying a selection twice fetches each URL once;
- it goes through everything else a frontier job does: robots.txt, the target's cap and
  back-off, retries (the retried job keeps its mark), dead letters (a new dead letter, with
  a new id, can be replayed in its turn).

The mark is the job's own: links found on a replayed page and a redirect's target are new
jobs without it (:func:`without_replay`), deduplicated as usual. Its page is stored under
the page's key, so it is one row whatever was replayed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from core.config import Settings
from core.errors import KafkaStageError
from infra.topics import topology_of
from producers.frontier import produce_patiently
from schemas.keys import REPLAY_META
from schemas.lineage import ENQUEUED, lineage_event
from schemas.records import CrawlJob
from streams.backpressure import FrontierGate
from streams.io import Encoder, connected_producer, producer_conf


def replay_id(dead_letter_id: str) -> str:
    """The replay id of a dead letter: stable, so replaying it again is a repeat."""
    return hashlib.sha256(dead_letter_id.encode()).hexdigest()[:16]


def without_replay(meta: dict[str, str] | None) -> dict[str, str]:
    """``meta`` for a job derived from this one (a link, a redirect): no replay mark."""
    if not meta:
        return {}
    if REPLAY_META not in meta:
        return meta
    return {k: v for k, v in meta.items() if k != REPLAY_META}


def replay_job(job: CrawlJob, dead_letter_id: str) -> CrawlJob:
    """The frontier job that replays ``job``: fresh attempts, no delay, its replay mark."""
    return {**job, "attempt": 0, "last_error": None, "delay_ms": 0,
            "meta": {**(job.get("meta") or {}), REPLAY_META: replay_id(dead_letter_id)}}


@dataclass
class ReplayReport:
    published: int = 0
    waited_s: float = 0.0


def publish_replays(jobs: Iterable[CrawlJob], settings: Settings) -> ReplayReport:
    """Publish replayed jobs to the frontier (idempotent producer, acks=all), each with its
    lineage event, blocking while the frontier is over its bound."""
    report = ReplayReport()
    topology = topology_of(settings)
    encoder = Encoder(topology, "replay")
    producer = connected_producer(producer_conf(settings, "crawlfleet-replay"))
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    gate = FrontierGate(settings)
    try:
        for job in jobs:
            if gate.over():
                producer.flush(30)
                report.waited_s += gate.wait()
            topic = topology.frontier_high if job.get("priority", 0) > 0 else topology.frontier
            rid = job["meta"][REPLAY_META]
            for out in (encoder.job(topic, job),
                        lineage_event(encoder, job, ENQUEUED, "replay", f"replay {rid}",
                                      job.get("parent_url"))):
                produce_patiently(producer, out, on_delivery)
            report.published += 1
            gate.add(1)
            producer.poll(0)
    except KafkaException as exc:
        raise KafkaStageError(f"replay publishing failed: {exc}") from exc
    finally:
        remaining = producer.flush(30)
        gate.close()
    if remaining or failures:
        raise KafkaStageError(f"{remaining} replays undelivered, {len(failures)} failed: "
                              f"{failures[:3]}")
    return report
