"""The fleet's control topic, ``crawl.control``: what people publish, what workers read.

Keys name a setting (``pause:*``, ``pause:target:T``, ``cap:T``, ``quarantine:SCOPE:T|NAME``,
``approved:TUPLE``);
a tombstone removes it, so compaction keeps exactly the settings in force. Every fetch worker
reads the whole topic (no consumer group, from the beginning), so a person's ``crawlfleet
pause`` reaches all workers within one poll. Fetch workers also report their parked backlog
here (``backlog:parked:pN``), a figure the frontier bound adds to the frontier's lag.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from core.config import Settings
from core.errors import DecodeError, InfraError
from infra.live_state import high_watermarks
from schemas.codec import Codec, HeadersIn
from schemas.records import Control
from streams.io import consume_ready, raw_value

GLOBAL_PAUSE = "pause:*"
#: Keys of the parked backlog a fetch worker reports per frontier partition it owns; the
#: frontier bound counts parked jobs as not yet fetched.
BACKLOG_PREFIX = "backlog:parked:"


#: A one-off crawl at its drain: fetch workers end the jobs a quarantine holds as dead
#: letters ``quarantined`` instead of waiting ``quarantine_s`` out. Only ``crawl`` writes it,
#: to its own namespace's control topic; a deployed fleet never gets it and keeps waiting.
END_HELD = "drain:end-held"


def pause_key(target: str | None) -> str:
    return GLOBAL_PAUSE if target is None else f"pause:target:{target}"


def cap_key(target: str) -> str:
    return f"cap:{target}"


def backlog_key(partition: int) -> str:
    return f"{BACKLOG_PREFIX}p{partition}"


#: Keys of the approved set: one per approved version tuple (its canonical string); a
#: tombstone revokes it. An empty set enforces nothing.
APPROVED_PREFIX = "approved:"


def approved_key(version_tuple: str) -> str:
    return f"{APPROVED_PREFIX}{version_tuple}"


QUARANTINE_PREFIX = "quarantine:"
#: What a quarantine retires: a (target, profile) pair, a (target, egress) pair, or a whole
#: target (paused because most of its profiles are quarantined).
QUARANTINE_SCOPES = ("profile", "egress", "target")


def quarantine_key(scope: str, target: str, name: str = "") -> str:
    """The compacted key of one quarantine: one record per scope, so a repeat overwrites."""
    assert scope in QUARANTINE_SCOPES
    return f"{QUARANTINE_PREFIX}{scope}:{target}|{name}"


@dataclass(frozen=True)
class Quarantine:
    """One identity, egress or target retired for a target until ``until_ms`` (Unix ms).

    As a control record: kind ``quarantine``, ``target``, ``value`` = ``until_ms``, ``text`` =
    JSON ``{"scope", "name", "reason"}``.
    """

    scope: str
    target: str
    name: str
    until_ms: int
    reason: str

    def active(self, now_ms: int) -> bool:
        return now_ms < self.until_ms

    def record(self, issued_by: str) -> Control:
        text = json.dumps({"scope": self.scope, "name": self.name, "reason": self.reason})
        return {"kind": "quarantine", "target": self.target, "value": float(self.until_ms),
                "text": text, "issued_by": issued_by}

    @staticmethod
    def of(value: Control) -> Quarantine | None:
        """The quarantine a control record states, or None if it states none readable."""
        try:
            meta = json.loads(value.get("text") or "{}")
            scope, name = str(meta["scope"]), str(meta.get("name", ""))
        except (ValueError, KeyError, TypeError):
            return None
        until, target = value.get("value"), value.get("target")
        if scope not in QUARANTINE_SCOPES or until is None or not target:
            return None
        return Quarantine(scope, target, name, int(until), str(meta.get("reason", "")))


@dataclass
class ControlState:
    """The settings in force, folded from control records in topic order: pure logic."""

    paused: bool = False
    paused_targets: set[str] = field(default_factory=set)
    caps: dict[str, float] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)  # parked jobs per partition
    quarantines: dict[str, Quarantine] = field(default_factory=dict)  # by control key
    approved: set[str] = field(default_factory=set)  # version tuples (canonical strings)
    end_held: bool = False  # END_HELD: jobs held by a quarantine end as dead letters
    version: int = 0  # bumped on every change of a setting, so readers can notice cheaply

    @property
    def parked(self) -> int:
        return sum(self.backlog.values())

    def apply(self, key: str, value: Control | None) -> None:
        if key.startswith(BACKLOG_PREFIX):  # a figure, not a setting: no version bump
            count = value.get("value") if value is not None else None
            if count:
                self.backlog[key] = int(count)
            else:
                self.backlog.pop(key, None)
            return
        self.version += 1
        if key == GLOBAL_PAUSE:
            self.paused = value is not None and value.get("kind") == "pause"
        elif key.startswith("pause:target:"):
            target = key[len("pause:target:"):]
            if value is not None and value.get("kind") == "pause":
                self.paused_targets.add(target)
            else:
                self.paused_targets.discard(target)
        elif key == END_HELD:
            self.end_held = value is not None and value.get("kind") == "end_held"
        elif key.startswith(QUARANTINE_PREFIX):
            q = Quarantine.of(value) if value is not None else None
            if q is not None:
                self.quarantines[key] = q
            else:
                self.quarantines.pop(key, None)
        elif key.startswith(APPROVED_PREFIX):
            tuple_text = key[len(APPROVED_PREFIX):]
            if value is not None and value.get("kind") == "approved":
                self.approved.add(tuple_text)
            else:
                self.approved.discard(tuple_text)
        elif key.startswith("cap:"):
            target = key[len("cap:"):]
            cap = value.get("value") if value is not None else None
            if cap is not None and cap > 0:
                self.caps[target] = float(cap)
            else:
                self.caps.pop(target, None)

    def target_paused(self, target: str) -> bool:
        return self.paused or target in self.paused_targets

    def quarantined(self, scope: str, target: str, name: str = "",
                    now_ms: int | None = None) -> Quarantine | None:
        """The active quarantine of ``scope`` (profile, egress, target) for ``target``."""
        q = self.quarantines.get(quarantine_key(scope, target, name))
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return q if q is not None and q.active(now) else None


#: How long the broker holds a control reader's empty fetch. A record arriving ends it at
#: once (a pause reaches every reader as fast as before), so a longer hold costs nothing but
#: the idle fetches it saves: at librdkafka's 500 ms the fleet's eight readers were a third of
#: an idle fleet's broker requests (issue 43). Other requests on the reader's connection
#: queue behind a held fetch (a watermark query waited 4.1 s at 5 s, measured), so a reader
#: already fetching asks its end through a client of its own (:meth:`ControlReader.catch_up`).
CONTROL_FETCH_WAIT_MS = 5000


class ControlReader:
    """Tails ``crawl.control``; call :meth:`poll` often (it never blocks)."""

    def __init__(self, settings: Settings, topic: str, codec: Codec) -> None:
        self.state = ControlState()
        self._codec = codec
        self._settings = settings
        self._consumer = Consumer({**settings.kafka_common(),
                                   "group.id": f"crawlfleet-control-{uuid.uuid4().hex}",
                                   "enable.auto.commit": False,
                                   "isolation.level": "read_committed",
                                   "fetch.wait.max.ms": CONTROL_FETCH_WAIT_MS})
        self._tp = TopicPartition(topic, 0)
        self._assigned = False

    def _assign(self) -> int | None:
        """Read from the log start, given as an offset: a new client's lookup of
        OFFSET_BEGINNING waits out librdkafka's offset-query back-off (0.5 s measured, at
        every worker's start once the topic holds a record). The high watermark read with
        it, when this call assigned (None if it did not, or could not read one)."""
        if self._assigned:
            return None
        try:
            start, end = self._consumer.get_watermark_offsets(self._tp, timeout=5.0)
        except KafkaException:
            start, end = OFFSET_BEGINNING, None  # asked again by librdkafka itself
        self._consumer.assign([TopicPartition(self._tp.topic, 0, start)])
        self._assigned = True
        return end

    def catch_up(self, timeout_s: float) -> bool:
        """Read to the end the topic had when called (True), or give up after ``timeout_s``.

        The end is the high watermark: a control record still in an open transaction (a
        backlog report) holds the reader until that transaction ends, which it does within
        the transaction timeout.
        """
        tp = self._tp
        deadline = time.monotonic() + timeout_s
        try:
            # The end read before the assignment, not after it: a partition just assigned
            # answers a watermark query only after a 0.5 s back-off about half the time
            # (measured), and every worker's start waited for it.
            end = self._assign()
            if end is None:  # not through the reader's own connection: a fetch holds it
                end = high_watermarks(self._settings, tp.topic, [0],
                                      max(0.1, timeout_s))[0]
        except (KafkaException, InfraError):
            return False
        while True:
            pos = self._consumer.position([tp])[0].offset
            if end <= 0 or pos >= end:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll(min(0.2, remaining))

    def poll(self, timeout: float = 0.0) -> bool:
        """Apply any new control records; True if the state changed."""
        before = self.state.version
        self._assign()
        for msg in consume_ready(self._consumer, 100, timeout):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    continue
                continue
            key = msg.key()
            if key is None:
                continue
            self._apply(key.decode() if isinstance(key, bytes) else key, raw_value(msg),
                        msg.headers())
        return self.state.version != before

    def _apply(self, key: str, value: bytes | None, headers: HeadersIn) -> None:
        if value is None:
            self.state.apply(key, None)
            return
        try:
            self.state.apply(key, self._codec.decode_as(Control, value, headers))
        except DecodeError:
            return  # a control record we cannot read changes nothing

    def close(self) -> None:
        self._consumer.close()
