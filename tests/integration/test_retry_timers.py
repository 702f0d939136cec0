"""The retry stage's timer store on the real broker: ordering by due time, and exactly once
across kill -9.

Jobs are written straight to the retry tiers, as the fetch stage writes them (attempt,
last_error and a ``delay_ms`` duration on the CrawlJob). What reaches the frontier is read
back ``read_committed``; what is still held is read from the ``crawl.timers`` changelog (the
last record of each key: a value is a pending timer, a tombstone a fired one).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Iterator

import pytest
from confluent_kafka import Producer

from consumers.retry import RetryStage
from core.config import Settings
from infra.topics import topology_of
from producers.frontier import parse_line
from schemas.keys import job_key
from schemas.topics import Topology, partition_for
from streams.io import Encoder, producer_conf
from streams.timers import due_of
from streams.worker import StopFlag
from tests.integration.fleet_helpers import (
    Record,
    Workers,
    create_all_topics,
    group_assignment,
    key_counts,
    read_topic,
    stage_lags,
    wait_until,
)

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
LEASE_MS = 6000  # a killed worker's partitions move on quickly


def _job(settings: Settings, url: str, delay_ms: int, priority: int = 0) -> dict[str, object]:
    job = parse_line(url, settings)
    assert job is not None
    return {**job, "attempt": 1, "last_error": "http_503", "delay_ms": delay_ms,
            "priority": priority}


def _key(job: dict[str, object]) -> str:
    return job_key(str(job["target"]), str(job["profile"]), str(job["url"])).decode()


def _write(settings: Settings, topic: str, jobs: Iterable[dict[str, object]]) -> None:
    """Write jobs to a retry tier in order (one producer, one partition per target)."""
    enc = Encoder(topology_of(settings), "test")
    producer = Producer(producer_conf(settings, "retry-timers-test"))
    for job in jobs:
        out = enc.job(topic, dict(job))
        producer.produce(out.topic, value=out.value, key=out.key, partition=out.partition,
                         headers=out.headers)
        producer.flush(10)  # one at a time: the order on the partition is the order given
    assert producer.flush(10) == 0


def _frontier(settings: Settings, topo: Topology) -> collections.Counter[str]:
    return key_counts([*read_topic(settings, topo.frontier),
                       *read_topic(settings, topo.frontier_high)])


def _timers(settings: Settings, topo: Topology) -> dict[bytes, Record]:
    """The last changelog record of each timer key (probe records left out)."""
    last: dict[bytes, Record] = {}
    for r in read_topic(settings, topo.timers):
        if r.key and not r.key.startswith(b"\x00"):
            last[r.key] = r
    return last


def _held_urls(settings: Settings, topo: Topology) -> dict[str, int]:
    """URL -> partition of every timer still pending on the changelog."""
    from schemas.codec import default_codec
    codec = default_codec()
    return {codec.decode("CrawlJob", r.value, r.headers)["url"]: r.partition
            for r in _timers(settings, topo).values() if r.value is not None}


@pytest.fixture
def stage_thread(settings: Settings) -> Iterator[RetryStage]:
    create_all_topics(settings)
    stop = StopFlag()
    stage = RetryStage(settings, "retry-t", stop=stop)
    worker = threading.Thread(target=stage.run, daemon=True, name="retry-stage")
    worker.start()
    try:
        yield stage
    finally:
        stop.set()
        worker.join(timeout=30)
        assert not worker.is_alive(), "the retry stage did not stop"


def test_a_short_delay_is_not_held_behind_an_hour_long_one(settings: Settings,
                                                           stage_thread: RetryStage) -> None:
    """In one partition of one tier, an hour-long Retry-After job first, then a job with a
    2 s delay: the 2 s job reaches the frontier while the hour job stays in the timer store."""
    topo = topology_of(settings)
    host = "127.0.0.4"  # targets are hosts: pick another that shares its partition
    other = next(f"127.0.0.{i}" for i in range(5, 250)
                 if partition_for(f"127.0.0.{i}", settings.topic_partitions)
                 == partition_for(host, settings.topic_partitions))
    hour = _job(settings, f"http://{host}/retry-after-3600", HOUR_MS)
    short = _job(settings, f"http://{host}/back-off-2s", 2000)
    neighbour = _job(settings, f"http://{other}/other-target", 2000, priority=1)
    assert len({partition_for(str(j["target"]), settings.topic_partitions)
                for j in (hour, short, neighbour)}) == 1
    stage = stage_thread
    assert stage.context is not None
    timers = stage.context.timer("timers")
    wait_until(lambda: timers.store.partitions() == set(range(settings.topic_partitions)), 60,
               "the retry stage to own and restore every partition")
    _write(settings, topo.retry(2), [hour, short, neighbour])

    wait_until(lambda: stage.status.counters.get("fired", 0) >= 2, 60,
               "the 2 s jobs to fire")

    counts = _frontier(settings, topo)
    assert counts == {_key(short): 1, _key(neighbour): 1}, counts  # hour job not there
    assert {k for k in key_counts(read_topic(settings, topo.frontier_high))} == {_key(neighbour)}
    # The hour job is held in the timer store (changelog value, local store), the two short
    # ones were tombstoned when they fired, and keys put the short ones first.
    last = _timers(settings, topo)
    assert len(last) == 3, last
    pending = [k for k, r in last.items() if r.value is not None]
    fired = [k for k, r in last.items() if r.value is None]
    assert len(pending) == 1 and len(fired) == 2
    assert all(due_of(f) < due_of(pending[0]) for f in fired)
    assert due_of(pending[0]) - min(due_of(f) for f in fired) >= HOUR_MS - 2000 - 60_000
    assert _held_urls(settings, topo) == {str(hour["url"]): partition_for(
        str(hour["target"]), settings.topic_partitions)}
    wait_until(lambda: stage.status.gauges.get("timers") == 1, 10, "the timers gauge")
    part = partition_for(host, settings.topic_partitions)
    assert [k for k, _ in timers.scan(part)] == pending
    # The fired jobs kept their attempt and reason; their delay was spent.
    from schemas.codec import default_codec
    fired_jobs = [default_codec().decode("CrawlJob", r.value, r.headers)
                  for t in (topo.frontier, topo.frontier_high) for r in read_topic(settings, t)]
    assert {(j["attempt"], j["last_error"], j["delay_ms"]) for j in fired_jobs} == {
        (1, "http_503", 0)}


def test_kill_9_with_timers_pending_fires_each_due_job_exactly_once(
        settings: Settings) -> None:
    """Timers pending across every partition and tier, the retry worker killed twice (kill -9,
    then dying right after a commit, before applying it locally); each due job reaches the
    frontier exactly once, the hour job is still held."""
    s = settings.replace(session_timeout_ms=LEASE_MS)
    topo = topology_of(s)
    create_all_topics(s)
    ws = Workers(s)
    try:
        worker = ws.start("retry", "retry-0")
        wait_until(lambda: len(group_assignment(s, "retry").get("retry-0", ())) ==
                   3 * s.topic_partitions, 60, "retry-0 to own every tier partition")
        wait_until(lambda: worker.status(), 30, "retry-0's first status")
        hosts = [f"127.0.0.{2 + i}" for i in range(8)]
        hour = _job(s, f"http://{hosts[0]}/hour", HOUR_MS)
        # Due 10-20 s after they were written: still pending when the worker is killed.
        first = [_job(s, f"http://{hosts[i % 8]}/first/{i}", 10_000 + 250 * i)
                 for i in range(40)]
        tier15 = [_job(s, f"http://{hosts[i % 8]}/tier15/{i}", 0) for i in range(8)]
        _write(s, topo.retry(2), [hour, *first])
        _write(s, topo.retry(15), tier15)
        wait_until(lambda: worker.gauge("timers") == 1 + len(first) + len(tier15), 30,
                   "every job to be held as a timer")
        assert not _frontier(s, topo), "nothing was due yet"
        worker.kill()  # kill -9, timers pending

        # Written while no retry worker runs: due soon after the restart.
        late = [_job(s, f"http://{hosts[i % 8]}/late/{i}", 1000) for i in range(16)]
        _write(s, topo.retry(2), late)
        # Restarted, it dies right after its second commit, before applying it locally.
        worker = ws.restart("retry-0", env={"CRAWLFLEET_FAULT": "after_commit:2"})
        assert worker.wait_exit(120) == 137, worker.log_tail()
        assert "dying at after_commit #2" in worker.log()
        worker = ws.restart("retry-0")

        due = [*first, *tier15, *late]

        def done() -> bool:
            assert worker.alive(), worker.log_tail()
            return (worker.status().get("pid") == worker.pid  # not a dead one's status
                    and worker.gauge("timers") == 1 and stage_lags(s)["retry"] == 0
                    and len(_frontier(s, topo)) >= len(due))
        wait_until(done, 120, "every due job to fire, the hour job alone left")
        counts = _frontier(s, topo)
        dupes = {k: n for k, n in counts.items() if n != 1}
        missing = {_key(j) for j in due} - set(counts)
        assert not dupes and not missing, (dupes, missing, ws.logs())
        assert set(counts) == {_key(j) for j in due}  # the hour job is not among them
        assert _held_urls(s, topo) == {str(hour["url"]): partition_for(
            str(hour["target"]), s.topic_partitions)}
        assert worker.counter("fired") >= 1, worker.status()
    finally:
        ws.close()
