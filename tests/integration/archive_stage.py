"""A stage of a user's own, declared through the public topology API alone (nothing outside
``tests/`` knows it): ``archive`` reads every parsed page (``crawl.parsed``, as a consumer
group of its own beside the store's) and writes it to ``crawl.archive`` keyed by its dedupe
key, on the runtime's batch stage, so each page's record is committed exactly once."""

from __future__ import annotations

from confluent_kafka import Message

from schemas.records import ParsedPage
from schemas.stages import StageSpec, TopicDecl, register_stage
from streams.batch_stage import BatchStage
from streams.io import Output

ARCHIVE = "crawl.archive"


class ArchiveStage(BatchStage):
    stage = "archive"

    def handle(self, msg: Message) -> list[Output]:
        # An unreadable record raises DecodeError: the runtime dead-letters it.
        page = self.encoder.decode_as(ParsedPage, msg)
        return [self.encoder.record(self.topology.prefix + ARCHIVE, page["target"],
                                    page["dedupe_key"].encode(), page)]


SPEC = StageSpec("archive", ("crawl.parsed",), f"{__name__}:ArchiveStage",
                 outputs=(ARCHIVE,), label="parsed→archive")
TOPICS = (TopicDecl(ARCHIVE, "ParsedPage"),)
register_stage(SPEC, TOPICS)  # on import: a worker process learns it from stage_modules
