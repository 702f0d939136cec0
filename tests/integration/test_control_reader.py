"""A control reader's catch-up asks the broker for the topic's watermarks once, before it
assigns the partition: a partition just assigned answers a watermark query only after a
0.5 s back-off about half the time, and every worker's start waited for it. Once assigned,
it asks through a client of its own (its fetch holds its connection)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from core.config import Settings
from infra.topics import create_topics, topology_of
from producers import control
from schemas.codec import default_codec
from streams import control as control_module
from streams.control import ControlReader

pytestmark = pytest.mark.integration


class _Recording(Consumer):  # type: ignore[misc]
    """Records each watermark query as asked before or after the first assignment."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.asked: list[str] = []
        self._assigned = False

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._assigned = True
        super().assign(partitions)

    def get_watermark_offsets(self, tp: TopicPartition, *args: Any,
                              **kwargs: Any) -> tuple[int, int]:
        self.asked.append("after" if self._assigned else "before")
        return super().get_watermark_offsets(tp, *args, **kwargs)  # type: ignore[no-any-return]


def test_catch_up_reads_the_watermarks_once_before_it_assigns(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    create_topics(settings)
    control.pause(settings)
    control.set_cap(settings, "b.test", 0.5)
    monkeypatch.setattr(control_module, "Consumer", _Recording)
    reader = ControlReader(settings, topology_of(settings).control, default_codec())
    try:
        assert reader.catch_up(30)
        assert reader.state.paused and reader.state.caps == {"b.test": 0.5}
        recorded = reader._consumer
        assert isinstance(recorded, _Recording)
        assert recorded.asked == ["before"]
        # A later catch-up asks for the new end through a client of its own: the reader's
        # connection is held by its fetch, which the broker keeps for up to 5 s.
        ends: list[dict[int, int]] = []
        own = control_module.high_watermarks

        def recording(*args: Any, **kwargs: Any) -> dict[int, int]:
            ends.append(own(*args, **kwargs))
            return ends[-1]

        monkeypatch.setattr(control_module, "high_watermarks", recording)
        control.resume(settings)
        assert reader.catch_up(30) and not reader.state.paused
        assert recorded.asked == ["before"] and len(ends) == 1 and ends[0][0] >= 3
    finally:
        reader.close()
