"""A stage of a user's own with a store, a timer and an output, declared in this module alone.

``recheck`` reads every parsed page (``crawl.parsed``, a consumer group of its own beside the
store's), keeps the page in its declared store ``pages`` and sets a timer ``due`` (keyed:
one per page) for a second later; when the timer fires it reads the page back from the
store, writes it to ``crawl.rechecked`` keyed by its dedupe key and deletes it from the
store. The store is
load-bearing: a page whose store entry was lost (a restore after a kill that missed it) is
never written, so one output per parsed page shows the store and the timer both came
back after every kill, and were fired once.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message

from schemas.records import ParsedPage
from schemas.stages import StageSpec, StoreDecl, TimerDecl, TopicDecl, register_stage
from streams.batch_stage import BatchStage
from streams.io import Output, tp_of

RECHECKED = "crawl.rechecked"
PAGES = "crawl.recheck.pages"
TIMERS = "crawl.recheck.timers"
#: How long after a page's parse its recheck is due (ms, from the parse record's time).
DELAY_MS = 1000


class RecheckStage(BatchStage):
    stage = "recheck"

    def handle(self, msg: Message) -> list[Output]:
        assert self.context is not None
        page = self.encoder.decode_as(ParsedPage, msg)
        part = tp_of(msg)[1]
        key = page["dedupe_key"].encode()
        due = msg.timestamp()[1] + DELAY_MS
        return [self.context.store("pages").put(part, key, page["target"], page),
                *self.context.timer("due").schedule(part, due, key, page["target"], page)]

    def on_timer(self, timer: str, part: int, ident: bytes,
                 record: dict[str, Any]) -> list[Output]:
        assert self.context is not None
        pages = self.context.store("pages")
        page = pages.get(part, ident)
        if page is None:  # the store lost it: no output, and the test sees a page missing
            self.status.add("recheck_missing")
            return []
        return [self.encoder.record(self.topology.prefix + RECHECKED, page["target"], ident,
                                    page),
                pages.delete(part, ident)]


SPEC = StageSpec("recheck", ("crawl.parsed",), f"{__name__}:RecheckStage",
                 outputs=(RECHECKED,),
                 stores=(StoreDecl("pages", PAGES, "ParsedPage"),),
                 timers=(TimerDecl("due", TIMERS, "ParsedPage", keyed=True),),
                 label="parsed→recheck")
TOPICS = (TopicDecl(RECHECKED, "ParsedPage"),)
register_stage(SPEC, TOPICS)  # on import: a worker process learns it from stage_modules
