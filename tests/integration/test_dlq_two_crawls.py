"""Two crawls' dead letters in one store, each crawl's topics on the real broker (issue 44):
`dlq list`, `show` and `replay` for crawl A touch A's dead letters only, and A's replay
republishes none of B's, counted on both crawls' frontiers and lineage topics. Before, `dlq
list` and `show` took no crawl and showed every crawl's, and `dlq replay --crawl A` put B's
dead jobs on A's frontier too (a dead letter names no crawl: its id does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, TopicPartition
from fleet_helpers import read_topic

from core.config import Settings
from crawlfleet.crawl import hold_data_dir
from infra.clickhouse import DEAD_COLUMNS, Store
from infra.topics import create_topics, delete_topics, topology_of
from producers.replay import replay_id
from schemas.codec import default_codec
from schemas.keys import REPLAY_META
from schemas.records import CrawlJob

pytestmark = pytest.mark.integration
SITE = "http://127.0.0.2:18099"


def _cli(s: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """As a user's shell runs it: the broker and the data dir, no prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env.update(CRAWLFLEET_BOOTSTRAP_SERVERS=s.bootstrap_servers,
               CRAWLFLEET_DATA_DIR=str(s.data_dir), COLUMNS="400")
    return subprocess.run([sys.executable, "-m", "crawlfleet.cli", "dlq", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _dead_letters(s: Settings, paths: list[str]) -> dict[str, str]:
    """Rows as the store writes them from crawl ``s``'s crawl.dead: id → URL."""
    dead = topology_of(s).dead
    rows, out = [], {}
    for offset, path in enumerate(paths):
        url, event_id = SITE + path, f"{dead}:0:{offset}"
        job = {"url": url, "profile": "default", "target": "127.0.0.2", "depth": 0,
               "attempt": 2, "priority": 0, "parent_url": None, "last_error": "http_503",
               "delay_ms": 0, "meta": {}, "pinned": True, "kind": "page", "visit": 0,
               "validators": {}}
        rows.append((event_id, datetime.now(UTC), url, "127.0.0.2", "default",
                     topology_of(s).frontier, "http_503", "HTTP 503", 2, "fetch-0", "0.1.0",
                     "", json.dumps(job)))
        out[event_id] = url
    store = Store(s)
    try:
        store.ensure_schema()
        store.insert("dead_letters", DEAD_COLUMNS, rows, f"dead|{dead}")
    finally:
        store.close()
    return out


def _jobs(s: Settings, topic: str) -> list[CrawlJob]:
    codec = default_codec()
    return [codec.decode_as(CrawlJob, r.value, r.headers) for r in read_topic(s, topic, 20)]


def _records(s: Settings, topics: list[str]) -> dict[str, int]:
    """Records each topic holds (its partitions' high watermarks: nothing is ever deleted
    from these topics within the test, and replay's producer writes no transaction markers)."""
    c = Consumer({**s.kafka_common(), "group.id": f"dlqtest-{uuid.uuid4().hex}"})
    try:
        meta = c.list_topics(timeout=10).topics
        return {t: sum(c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
                       for p in meta[t].partitions) for t in topics}
    finally:
        c.close()


def test_list_show_and_replay_of_crawl_a_touch_none_of_crawl_bs(settings: Settings) -> None:
    a, b = settings, settings.replace(topic_prefix=f"t{uuid.uuid4().hex[:10]}.")
    create_topics(a)
    create_topics(b)
    try:
        of_a = _dead_letters(a, ["/a0", "/both"])
        of_b = _dead_letters(b, ["/b0", "/b1", "/both"])  # one page dead in both crawls

        listed = _cli(a, "list", "--crawl", a.topic_prefix.rstrip("."))
        assert listed.returncode == 0, listed.stderr
        assert f"dead letters of crawl {a.topic_prefix}" in listed.stdout
        assert all(i in listed.stdout for i in of_a), listed.stdout
        assert not any(i in listed.stdout for i in of_b), listed.stdout

        b_id = next(iter(of_b))
        other = _cli(a, "show", b_id, "--topic-prefix", a.topic_prefix)
        assert other.returncode == 2
        assert f"is crawl {b.topic_prefix}'s, not crawl {a.topic_prefix}'s" in other.stderr

        with hold_data_dir(a):  # crawl A runs on the data dir: no name needed
            replayed = _cli(a, "replay", "--all")
        assert replayed.returncode == 0, replayed.stderr
        assert f"2 replayed in crawl {a.topic_prefix}" in replayed.stdout, replayed.stdout

        # What the broker holds: A's dead jobs on A's frontier, each marked by its own dead
        # letter, and nothing of B's anywhere.
        jobs = _jobs(a, topology_of(a).frontier)
        assert sorted((j["url"], j["meta"][REPLAY_META]) for j in jobs) == \
            sorted((url, replay_id(i)) for i, url in of_a.items())
        ta, tb = topology_of(a), topology_of(b)
        assert _records(a, [ta.frontier_high, ta.lineage, tb.frontier, tb.frontier_high,
                            tb.lineage]) == {ta.frontier_high: 0, ta.lineage: len(of_a),
                                             tb.frontier: 0, tb.frontier_high: 0,
                                             tb.lineage: 0}
    finally:
        delete_topics(b, timeout_s=10)
