"""Publishing to the fleet's control topic, ``crawl.control``: ``crawlfleet pause``,
``resume`` and live caps (what workers read: :mod:`streams.control`)."""

from __future__ import annotations

import getpass

from confluent_kafka import (
    Producer,
)

from core.config import Settings
from core.errors import KafkaStageError
from infra.topics import topology_of
from schemas.records import Control
from streams.control import cap_key, pause_key
from streams.io import Encoder, producer_conf


def _send(settings: Settings, key: str, value: Control | None) -> None:
    topology = topology_of(settings)
    producer = Producer(producer_conf(settings, "crawlfleet-control"))
    encoder = Encoder(topology, "control")
    out = encoder.control(key, value)
    producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers,
                     partition=out.partition)
    if producer.flush(30):
        raise KafkaStageError(f"control record {key} was not delivered")


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def pause(settings: Settings, target: str | None = None) -> None:
    """Stop every fetch worker from dequeuing (globally or for one target)."""
    _send(settings, pause_key(target), {"kind": "pause", "target": target, "value": None,
                                        "text": None, "issued_by": _who()})


def resume(settings: Settings, target: str | None = None) -> None:
    """Undo :func:`pause` (a tombstone: compaction then forgets the pause)."""
    _send(settings, pause_key(target), None)


def set_cap(settings: Settings, target: str, rate: float | None) -> None:
    """Set (or with None, clear) a live per-target cap in requests per second."""
    if rate is None:
        _send(settings, cap_key(target), None)
    else:
        _send(settings, cap_key(target), {"kind": "cap", "target": target, "value": rate,
                                          "text": None, "issued_by": _who()})
