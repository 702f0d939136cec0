"""The broker's clock, read off a write of our own: its delivery report's LogAppendTime.

A stage that keeps time by the broker (the retry stage's timers) bounds broker-now from the
timestamps it sees; with no record arriving, :class:`BrokerTimeProbe` makes one: a tombstone
under a key the stage's restores skip, whose delivery report carries the time the broker
appended it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)

from core.config import Settings
from streams.io import producer_conf

_log = logging.getLogger("crawlfleet.broker_time")


class BrokerTimeProbe:
    """Writes a tombstone and hands the broker's LogAppendTime of it to ``on_time`` (ms).

    The producer (idempotent, not transactional) is made at the first probe. A probe that
    fails or is not delivered in time is logged (``name`` says whose, to ``log``) and
    otherwise ignored: the stage's time bound only stays where it was.
    """

    def __init__(self, settings: Settings, client_id: str, on_time: Callable[[int], object],
                 name: str = "clock probe", log: logging.Logger = _log) -> None:
        self._settings, self._client_id = settings, client_id
        self._on_time = on_time
        self.name, self._log = name, log
        self._producer: Producer | None = None

    def probe(self, topic: str, partition: int, key: bytes, timeout_s: float = 10.0) -> None:
        """Write a tombstone of ``key`` to ``topic``/``partition`` and wait up to
        ``timeout_s`` for its delivery report (``on_time`` runs in it, on this thread)."""
        if self._producer is None:
            self._producer = Producer(producer_conf(self._settings, self._client_id))

        def delivered(err: KafkaError | None, msg: Message) -> None:
            ts_type, ts = msg.timestamp()
            if err is None and ts_type == TIMESTAMP_LOG_APPEND_TIME:
                self._on_time(ts)

        try:
            self._producer.produce(topic, key=key, value=None, partition=partition,
                                   on_delivery=delivered)
            if self._producer.flush(timeout_s):
                self._log.warning("%s not delivered within %.0f s", self.name, timeout_s)
        except KafkaException as exc:
            self._log.warning("%s failed: %s", self.name, exc)

    def close(self, timeout_s: float = 5.0) -> None:
        """Let a probe still in flight finish (or give up after ``timeout_s``)."""
        if self._producer is not None:
            self._producer.flush(timeout_s)
