"""Retry scheduler: a stage with a timer store, fed by the ``crawl.retry.<delay>`` tiers.

Each tier record is due at its LogAppendTime plus the job's own ``delay_ms`` (the tier's
delay if it has none: :func:`due_ms`). A record already due goes straight back to the
frontier; any other becomes a timer of the stage's declared timer store ``timers`` (its
changelog ``crawl.timers``, same partition number as its tier partition: every target topic
is co-partitioned), keyed by its due time and the input record's (tier, offset), so the same
input replayed after an abort gets the same key. Everything else is the runtime's
(:mod:`streams.stage_context`): the store's restore on assign, the write reaching the local
store only after its transaction commits, firing what is due between polls on the broker's
clock (late, never early) into :meth:`RetryStage.on_timer` with the timer's tombstone in the
same transaction. So a job due in 2 s is never behind one due in an hour, whatever their
tier.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from schemas.lineage import RELEASED, lineage_event
from schemas.pipeline import RETRY_DELAYS_S
from schemas.records import CrawlJob
from streams.batch_stage import BatchStage
from streams.io import Output, offset_of, tp_of

log = logging.getLogger("crawlfleet.retry")

#: The stage's timer store (``StageSpec.timers`` in :mod:`schemas.pipeline`).
TIMERS = "timers"


def due_ms(append_ms: int, tier_delay_ms: int, job_delay_ms: int) -> int:
    """Broker time at which a job appended to a retry tier at ``append_ms`` is due.

    The job's own delay (Retry-After, back-off) when it carries one: the fetch stage writes
    the exact delay and picks the tier only as a carrier, so a 20 s Retry-After in the 120 s
    tier is due after 20 s. A job without one (``delay_ms`` 0, or a v1 record) waits its
    tier's delay.
    """
    return append_ms + (job_delay_ms if job_delay_ms > 0 else tier_delay_ms)


def timer_id(tier: int, offset: int) -> bytes:
    """The timer's id: the input record's tier index and offset (unique in its partition)."""
    if not 0 <= tier < 256 or not 0 <= offset < 1 << 64:
        raise ValueError(f"timer id out of range: tier={tier} offset={offset}")
    return bytes((tier,)) + offset.to_bytes(8, "big")


def parse_id(ident: bytes) -> tuple[int, int]:
    """(tier, offset) of a timer id."""
    if len(ident) != 9:
        raise ValueError(f"not a retry timer id: {ident!r}")
    return ident[0], int.from_bytes(ident[1:], "big")


def is_due(due: int, now_ms: int | None) -> bool:
    """Due now? Never while broker time is unknown (``now_ms`` None)."""
    return now_ms is not None and due <= now_ms


class RetryStage(BatchStage):
    stage = "retry"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tiers = {self.topology.retry(d): (i, d * 1000) for i, d in enumerate(RETRY_DELAYS_S)}
        self._create_time: set[tuple[str, int]] = set()  # tier partitions warned about

    def handle(self, msg: Message) -> list[Output]:
        assert self.context is not None  # the stage declares its timer store
        job = self.encoder.decode_job(msg)
        topic, part = tp_of(msg)
        tier, tier_delay_ms = self._tiers[topic]
        ts_type, ts = msg.timestamp()
        if ts_type != TIMESTAMP_LOG_APPEND_TIME and (topic, part) not in self._create_time:
            # A producer's clock never moves the estimate (it could make timers early).
            self._create_time.add((topic, part))
            log.warning("%s p%d has no LogAppendTime; its delays run from the producer's "
                        "clock", topic, part)
        due = due_ms(ts, tier_delay_ms, job.get("delay_ms", 0))
        if is_due(due, self.context.now_ms()):
            self.status.add("forwarded")
            return self._to_frontier(job)
        self.status.add("timers_set")
        return self.context.timer(TIMERS).schedule(part, due, timer_id(tier, offset_of(msg)),
                                                   job["target"], job)

    def on_timer(self, timer: str, part: int, ident: bytes,
                 record: dict[str, Any]) -> list[Output]:
        """A due job goes back to the frontier (its timer's tombstone goes with it)."""
        return self._to_frontier(cast(CrawlJob, record))

    def _to_frontier(self, job: CrawlJob) -> list[Output]:
        """The job back on the frontier, and its lineage event (released, with its reason)."""
        topic = self.topology.frontier_high if job.get("priority", 0) > 0 \
            else self.topology.frontier
        return [self.encoder.job(topic, {**job, "delay_ms": 0}),
                lineage_event(self.encoder, job, RELEASED, "retry", job.get("last_error") or "")]
