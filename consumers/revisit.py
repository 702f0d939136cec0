"""Revisit scheduler (issue 45): a stage with one keyed timer store, fed by ``crawl.revisits``.

The parse stage decides, for each visit of a page that reached the site (a 2xx, or a 304 to
a revisit), whether the page is visited again and when (its target's
:class:`core.revisits.RevisitPolicy`, from the visit's ``changed`` and the interval that led
to it), and writes the next visit's job to ``crawl.revisits`` in the same transaction as the
page: visit number + 1, the validators the next request sends, the interval as
``delay_ms``. This stage holds that job on a timer until it is due (the record's
LogAppendTime plus ``delay_ms``: broker time, never a worker's clock), then puts it on the
frontier. The timer store is keyed by the page's key, so a page has at most one next visit
waiting, whatever replays after an aborted transaction: scheduling the same page again
moves its timer. The runtime restores the timers after a kill or a rebalance and fires each
once (its tombstone in the transaction that writes the job). A visit is never a sleeping
job, and its dedupe key carries the visit number (``schemas.keys``), so the seen store
never suppresses a due revisit and never lets one visit be fetched and stored twice.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from consumers.retry import is_due
from schemas.keys import page_key
from schemas.lineage import RELEASED, lineage_event
from schemas.records import CrawlJob
from streams.batch_stage import BatchStage
from streams.io import Output, tp_of

log = logging.getLogger("crawlfleet.revisit")

#: The stage's keyed timer store (``StageSpec.timers`` in :mod:`schemas.pipeline`).
TIMERS = "due"


class RevisitStage(BatchStage):
    stage = "revisit"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_time: set[tuple[str, int]] = set()  # partitions warned about

    def handle(self, msg: Message) -> list[Output]:
        assert self.context is not None  # the stage declares its timer store
        job = self.encoder.decode_job(msg)
        topic, part = tp_of(msg)
        ts_type, ts = msg.timestamp()
        if ts_type != TIMESTAMP_LOG_APPEND_TIME and (topic, part) not in self._create_time:
            self._create_time.add((topic, part))
            log.warning("%s p%d has no LogAppendTime; revisits run from the producer's "
                        "clock", topic, part)
        due = ts + max(0, int(job.get("delay_ms", 0)))
        if is_due(due, self.context.now_ms()):
            self.status.add("revisits_forwarded")
            return self._to_frontier(job)
        self.status.add("revisits_scheduled")
        return self.context.timer(TIMERS).schedule(part, due, page_key(job).encode(),
                                                   job["target"], job)

    def on_timer(self, timer: str, part: int, ident: bytes,
                 record: dict[str, Any]) -> list[Output]:
        """A due visit goes to the frontier (its timer's tombstone goes with it)."""
        return self._to_frontier(cast(CrawlJob, record))

    def _to_frontier(self, job: CrawlJob) -> list[Output]:
        self.status.add("revisits_due")
        topic = self.topology.frontier_high if job.get("priority", 0) > 0 \
            else self.topology.frontier
        return [self.encoder.job(topic, {**job, "delay_ms": 0}),
                lineage_event(self.encoder, job, RELEASED, "revisit",
                              f"visit {job.get('visit', 0)}")]
