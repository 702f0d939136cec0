"""Queue depth: how far each stage's consumer group is behind its input topics."""

from __future__ import annotations

import time
from concurrent.futures import Future

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from core.config import Settings
from schemas.stages import stages
from schemas.topics import Topology

#: How long one look waits for end offsets before leaving the partitions not answered out.
OFFSETS_WAIT_S = 1.0


class LagProbe:
    """Reads committed offsets and end offsets; clients reused across calls.

    End offsets of every partition are asked in one ListOffsets request per broker (not one
    request per partition): the progress view and the frontier gate probe often, and the
    broker shares its cores with the stages.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._consumers: dict[str, Consumer] = {}
        self._admin: AdminClient | None = None
        #: The end offset of every partition read by the last call, (topic, partition) →
        #: offset: two calls that read the same ends saw no record added in between.
        self.ends: dict[tuple[str, int], int] = {}

    def lag(self, group: str, topics: list[str], partitions: int) -> int:
        """Records not yet committed by ``group`` (transaction markers count as one each);
        -1 when unknown, also when a partition's end offset could not be read (a sum over
        the others would read low, and "drained" is decided on these figures)."""
        positions = self.positions(group, topics, partitions)
        if positions is None or len(positions) < len(topics) * partitions:
            return -1
        return sum(max(0, high - start) for start, high in positions.values())

    def committed(self, group: str, topics: list[str],
                  partitions: int) -> dict[tuple[str, int], int] | None:
        """``group``'s committed offset per partition (-1: none yet), from the group
        coordinator alone (no end offsets asked of the partition leaders); None if
        unavailable."""
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        try:
            got = self._consumer(group).committed(tps, timeout=10)
        except KafkaException:
            return None
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else -1 for tp in got}

    def _consumer(self, group: str) -> Consumer:
        c = self._consumers.get(group)
        if c is None:
            # read_uncommitted: the offsets committed now, never a wait for a pending
            # transaction's (a read_committed client asks for stable offsets: the broker
            # refuses them, UNSTABLE_OFFSET_COMMIT, while a transaction's offsets are
            # pending, and the client asks again until it ends). A pending commit's
            # offsets are not counted yet: the lag reads higher, never lower.
            c = self._consumers[group] = Consumer({**self._settings.kafka_common(),
                                                   "group.id": group,
                                                   "enable.auto.commit": False,
                                                   "isolation.level": "read_uncommitted"})
        return c

    def positions(self, group: str, topics: list[str],
                  partitions: int) -> dict[tuple[str, int], tuple[int, int]] | None:
        """(next offset ``group`` reads, end offset) per partition; None if unavailable."""
        committed = self.committed(group, topics, partitions)
        if committed is None:
            return None
        try:
            high = self._offsets(set(committed), OffsetSpec.latest())  # type: ignore[no-untyped-call]
            self.ends.update(high)
            # A group that never committed starts from the earliest offset still kept.
            unset = {key for key, offset in committed.items() if offset < 0}
            low = self._offsets(unset, OffsetSpec.earliest()) if unset else {}  # type: ignore[no-untyped-call]
        except KafkaException:
            return None
        return {key: (offset if offset >= 0 else low.get(key, 0), high[key])
                for key, offset in committed.items() if key in high}

    def stage_lags(self, topology: Topology) -> dict[str, int]:
        """Queue depth of every stage (its group's lag on its inputs), by stage name."""
        self.ends = {}
        return {stage: self.lag(topology.group(stage), topology.inputs(stage),
                                topology.partitions) for stage in stages()}

    def _offsets(self, tps: set[tuple[str, int]], spec: OffsetSpec) -> dict[tuple[str, int], int]:
        """Offsets of ``tps`` by ``spec`` (high watermark for latest), batched per broker.

        A partition not answered within ``OFFSETS_WAIT_S`` is left out (as one whose leader
        is not known yet): on topics made a moment ago an answer took ~3 s in some crawls'
        first look, and the crawl's drain watch waited that long before its next look.
        """
        if self._admin is None:
            self._admin = AdminClient(self._settings.kafka_common())
        futures: dict[TopicPartition, Future[object]] = self._admin.list_offsets(
            {TopicPartition(t, p): spec for t, p in tps},
            isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=10)
        out: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + OFFSETS_WAIT_S
        for tp, fut in futures.items():
            try:
                got = fut.result(timeout=max(0.0, deadline - time.monotonic()))
                out[(tp.topic, tp.partition)] = int(got.offset)  # type: ignore[attr-defined]
            except (KafkaException, TimeoutError):
                continue  # partition not (yet) known, or not answered yet: left out
        return out

    def close(self) -> None:
        for c in self._consumers.values():
            c.close()
        self._consumers.clear()
        self._admin = None
