"""Where a lost URL's records are on the broker: its lineage as the topics hold it.

``crawlfleet trace`` reads the store, which only knows what reached it; a URL the store
never saw needs the other half of its story from the broker. This reads every topic a
job passes through, ``read_committed`` from the start to the last stable offset (what any
downstream consumer could ever see), and lists per URL the committed records that carry
it: published to the frontier, fetched, parsed, sent to a retry tier, dead-lettered, its
dedupe state in ``crawl.seen``, and whether its ``crawl.parked`` / ``crawl.timers`` entry
is still live or was tombstoned (and where). Keys of job records end in ``|<url>``; parked
and timer entries are keyed by position, so their values are decoded to find the URL and a
later tombstone of the same key is matched to it.

:func:`committed_repeats` reads one topic the same way and counts keys committed more than
once: a result downstream would have seen twice.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from core.config import Settings
from core.errors import DecodeError, InfraError
from schemas.topics import Topology
from streams.io import Encoder


@dataclass(frozen=True)
class Sighting:
    topic: str
    partition: int
    offset: int
    what: str  # "record", "live", "tombstone", or the decoded dedupe state


def _topics(topo: Topology) -> list[str]:
    return [topo.frontier, topo.frontier_high, topo.fetched, topo.parsed, *topo.retry_topics,
            topo.dead, topo.seen, topo.parked, topo.timers]


def broker_lineage(settings: Settings, topo: Topology, urls: Iterable[str],
                   timeout_s: float = 120.0) -> dict[str, list[Sighting]]:
    """Every committed record of each URL in ``urls``, in the order a job passes the
    topics, then by offset."""
    wanted = set(urls)
    out: dict[str, list[Sighting]] = {u: [] for u in wanted}
    if not wanted:
        return out
    enc = Encoder(topo, "broker-trace")
    keyed = {topo.parked, topo.timers}
    consumer = Consumer({**settings.kafka_common(),
                         "group.id": f"crawlfleet-trace-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    # (topic, partition, key) -> the URL a parked/timer entry holds, for its tombstone
    entry_url: dict[tuple[str, int, bytes], str] = {}
    try:
        parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in _topics(topo)
                 for p in range(topo.partitions)]
        consumer.assign(parts)
        pending = {(tp.topic, tp.partition) for tp in parts}
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise InfraError(f"could not read {len(pending)} partitions to their end "
                                 f"within {timeout_s:g}s")
            for msg in consumer.consume(2000, 0.5):
                topic, part = msg.topic(), msg.partition()
                assert topic is not None and part is not None
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard((topic, part))
                    continue
                raw_key = msg.key()
                key = raw_key.encode() if isinstance(raw_key, str) else (raw_key or b"")
                offset = msg.offset() or 0
                if topic in keyed:
                    url = _entry_url(enc, msg, entry_url, (topic, part, key))
                    if url in wanted:
                        what = "live" if msg.value() is not None else "tombstone"
                        out[url].append(Sighting(topic, part, offset, what))
                    continue
                url = key.rsplit(b"|", 1)[-1].decode("utf-8", "replace")
                if url not in wanted:
                    continue
                what = "record"
                if topic == topo.seen:
                    what = _seen_state(enc, msg)
                out[url].append(Sighting(topic, part, offset, what))
    finally:
        consumer.close()
    order = {t: i for i, t in enumerate(_topics(topo))}
    for seen in out.values():
        seen.sort(key=lambda x: (order[x.topic], x.partition, x.offset))
    return out


def _entry_url(enc: Encoder, msg: Message, known: dict[tuple[str, int, bytes], str],
               where: tuple[str, int, bytes]) -> str:
    if msg.value() is None:
        return known.pop(where, "")
    try:
        url = str(enc.decode(msg)["url"])
    except (DecodeError, KeyError):
        return ""
    known[where] = url
    return url


def _seen_state(enc: Encoder, msg: Message) -> str:
    if msg.value() is None:
        return "seen tombstone"
    try:
        v = enc.decode(msg)
    except DecodeError:
        return "seen (undecodable)"
    return f"seen {v.get('state')} attempt {v.get('attempt')} status {v.get('status')}"


def lineage_lines(topo: Topology, sightings: list[Sighting]) -> list[str]:
    """One line per topic: what the broker holds for a URL there."""
    if not sightings:
        return ["broker: no committed record in any topic (never published, or only in "
                "aborted transactions)"]
    by_topic: dict[str, list[Sighting]] = defaultdict(list)
    for s in sightings:
        by_topic[s.topic].append(s)
    lines = []
    for topic in _topics(topo):
        seen = by_topic.get(topic)
        if not seen:
            lines.append(f"broker: {_short(topo, topic)}: -")
            continue
        last = seen[-1]
        lines.append(f"broker: {_short(topo, topic)}: {len(seen)} record(s), last "
                     f"p{last.partition}@{last.offset} {last.what}"
                     + ("" if last.what != "live" else "  <- STILL LIVE"))
    return lines


def _short(topo: Topology, topic: str) -> str:
    return topic[len(topo.prefix):] if topic.startswith(topo.prefix) else topic


def committed_repeats(settings: Settings, topic: str, partitions: int,
                      timeout_s: float = 120.0) -> tuple[int, int]:
    """(records, repeats) committed in ``topic``: each key seen more than once counts.

    Read ``read_committed`` from the beginning to the last stable offset, exactly what a
    downstream consumer sees; aborted records (a killed worker's open transaction) are not.
    """
    consumer = Consumer({**settings.kafka_common(),
                         "group.id": f"crawlfleet-audit-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    counts: Counter[bytes] = Counter()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        pending = set(range(partitions))
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise InfraError(f"could not read {topic} to its end within {timeout_s:g}s")
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                key = msg.key()
                counts[key.encode() if isinstance(key, str) else (key or b"")] += 1
    finally:
        consumer.close()
    return sum(counts.values()), sum(n - 1 for n in counts.values() if n > 1)
