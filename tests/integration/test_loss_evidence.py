"""Drain from the broker and lost URLs' lineage from the broker, on the real test broker.

A pipeline whose gauges all read 0 is not drained while ``crawl.parked`` or
``crawl.timers`` holds a live entry (issue 17: 77 jobs stranded in ``crawl.parked`` while
every gauge read 0). These tests write the changelogs the way the stages do (committed
transactions, tombstones, an open transaction) and check what the chaos drain check and
the evidence of a lost URL read back.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from rich.console import Console

from chaos.broker_trace import broker_lineage, lineage_lines
from chaos.drain import BrokerState, DrainCheck, broker_state
from chaos.evidence import keep_evidence
from chaos.exposure import Bound
from chaos.loss_check import StoreRows, check
from chaos.report import ChaosReport
from core.config import Settings
from core.urls import canonicalize
from crawlfleet.crawl import Fleet, Plan
from infra.topics import create_topics, topology_of
from sites.scripted_site import ScriptedSite, page
from streams.io import Encoder, Output
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    wait_drained,
    wait_until,
)

pytestmark = pytest.mark.integration

URL = "http://127.0.0.2:18999/p/42.html"
OTHER = "http://127.0.0.2:18999/p/43.html"
TARGET = "127.0.0.2:18999"
HOST = "127.0.0.3"
REPO = Path(__file__).resolve().parents[2]


def _job(url: str) -> dict[str, object]:
    return {"url": url, "target": TARGET, "profile": "default", "depth": 1, "attempt": 0,
            "parent_url": None, "last_error": None, "priority": 0, "meta": {}, "delay_ms": 0}


class _Txn:
    """A transactional producer writing as a stage does."""

    def __init__(self, settings: Settings) -> None:
        self.p = Producer({**settings.kafka_common(),
                           "transactional.id": f"test-{uuid.uuid4().hex[:8]}"})
        self.p.init_transactions(30)

    def write(self, outputs: list[Output], commit: bool = True) -> None:
        self.p.begin_transaction()
        for o in outputs:
            self.p.produce(o.topic, value=o.value, key=o.key, partition=o.partition,
                           headers=o.headers)
        self.p.flush(30)
        if commit:
            self.p.commit_transaction(30)

    def abort(self) -> None:
        self.p.abort_transaction(30)


@pytest.fixture
def topics(settings: Settings) -> Iterator[Settings]:
    create_topics(settings)
    yield settings


def test_a_live_parked_entry_keeps_a_calm_fleet_from_counting_as_drained(
        topics: Settings, tmp_path: Path) -> None:
    s = topics
    topo = topology_of(s)
    enc = Encoder(topo, "test")
    # No workers, no lag, no status files: every gauge-based check says "drained".
    fleet = Fleet(s, Plan(fetch_workers=0, parse_workers=0, retry_workers=0, store_workers=0,
                          other_workers=0),
                  tmp_path / "logs")
    drain = DrainCheck(s, topo, fleet)
    try:
        # (a fresh topic's leaders may not be known yet: unreadable is not drained)
        wait_until(lambda: drain.drained([]), 30, "an empty pipeline to count as drained")
        park_key = f"{TARGET}\x000\x007".encode()
        txn = _Txn(s)
        txn.write([enc.record(topo.parked, TARGET, park_key, _job(URL))])
        assert not drain.drained([])
        assert "crawl.parked holds 1 live entries" in drain.why
        txn.write([enc.record(topo.timers, TARGET, b"due-1", _job(OTHER)),
                   enc.record(topo.parked, TARGET, park_key, None)])  # unparked, timer set
        assert not drain.drained([])
        assert "crawl.timers holds 1 live entries" in drain.why
        assert "parked" not in drain.why
        txn.write([enc.record(topo.timers, TARGET, b"due-1", None)])
        assert drain.drained([]), drain.why
        # An open transaction on a changelog is work whose fate is unknown: not drained.
        txn.write([enc.record(topo.parked, TARGET, b"k2", _job(URL))], commit=False)
        state = broker_state(s, topo)
        assert state.unsettled and not state.empty, state
        txn.abort()
        assert broker_state(s, topo).empty
    finally:
        drain.close()


def test_a_lost_urls_broker_lineage_names_every_topic_it_reached(topics: Settings) -> None:
    s = topics
    topo = topology_of(s)
    enc = Encoder(topo, "test")
    txn = _Txn(s)
    job = _job(URL)
    park_key = f"{TARGET}\x000\x0011".encode()
    txn.write([enc.job(topo.frontier, job),
               enc.record(topo.parked, TARGET, park_key, job)])  # published, then parked
    txn.write([enc.job(topo.frontier, _job(OTHER))], commit=False)  # never committed
    txn.abort()
    found = broker_lineage(s, topo, [URL, OTHER], timeout_s=60)
    assert [(x.topic, x.what) for x in found[URL]] == [(topo.frontier, "record"),
                                                       (topo.parked, "live")]
    assert found[OTHER] == []  # only in an aborted transaction
    lines = lineage_lines(topo, found[URL])
    assert any(line.startswith("broker: crawl.parked: 1 record(s)") and "STILL LIVE" in line
               for line in lines), lines
    assert "broker: crawl.fetched: -" in lines
    assert lineage_lines(topo, [])[0].startswith("broker: no committed record")
    # Unparked: the tombstone of the same key is matched to the URL it held.
    txn.write([enc.record(topo.parked, TARGET, park_key, None),
               enc.record(topo.seen, TARGET, f"default|{URL}".encode(),
                          {"state": "DONE", "attempt": 0, "status": 200})])
    found = broker_lineage(s, topo, [URL], timeout_s=60)
    assert (topo.seen, "seen DONE attempt 0 status 200") in [(x.topic, x.what)
                                                            for x in found[URL]]
    lines = lineage_lines(topo, found[URL])
    assert any(line.startswith("broker: crawl.parked: 2 record(s)")
               and line.endswith("tombstone") for line in lines), lines


def test_a_failed_rounds_evidence_traces_each_lost_url_from_store_and_broker(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    """keep_evidence on a real crawl: one URL the pipeline did store and one it never saw,
    both listed as lost, get their lineage from the store's tables and the broker's topics."""
    s = settings
    create_all_topics(s)
    ws = fleet(s)
    with ScriptedSite(HOST, site_port) as site:
        home, a = (canonicalize(site.url(p)) for p in ("/index.html", "/a.html"))
        never = canonicalize(site.url("/never.html"))
        site.set("/index.html", page(a))
        site.set("/a.html", page())
        ws.start_pipeline()
        publish_seeds(s, [home])
        wait_drained(s, ws, 90, lambda: page_counts(s).final >= 2)
        topo = topology_of(s)
        verdict = check({home: 200, a: 200, never: 200}, {home: 1, a: 1},
                        StoreRows(final={home: 1}, raw={home: 1}, raw_keys={home: 1},
                                  status={home: 200}, dead={}))  # as if a were lost
        assert verdict.lost == (a, never)
        report = ChaosReport(
            pages=3, nodes=1, hosts=1, fetch_workers=1, parse_workers=1, kill_every_s=8.0,
            seed=1, rate_cap=s.rate_cap, topic_prefix=s.topic_prefix, session_timeout_s=30.0,
            verdict=verdict, committed_duplicates=0, parsed_records=2, robots_requests=1,
            bound=Bound(requests=0, store_rows=0, legacy=0, gauge_missing=True, drops=0),
            kills=[], faults=[], restarts=0, broker=BrokerState(), seconds=1.0,
            crawl_seconds=1.0, drain_seconds=0.0, drained=True)
        out = Console(file=io.StringIO(), width=200)
        kafka_home = REPO / ".crawlfleet" / "test-kafka"
        folder = keep_evidence(report, s, topo, kafka_home, out)
    assert folder == s.data_dir
    lineage = (folder / "lineage.txt").read_text()
    blocks = {b.split("\n", 1)[0]: b for b in lineage.split("== ")[1:]}
    traced_a = blocks[a]
    assert "store: " in traced_a and "enqueued" in traced_a and "stored" in traced_a
    assert "broker: crawl.frontier: 1 record(s)" in traced_a
    assert "broker: crawl.parsed: 1 record(s)" in traced_a
    assert "broker: crawl.seen: 1 record(s)" in traced_a and "seen DONE" in traced_a
    traced_never = blocks[never]
    assert "store: no lineage event" in traced_never
    assert "broker: no committed record" in traced_never
    text = (folder / "report.txt").read_text()
    assert "LOST (neither): 2" in text and never in text
    assert json.loads((folder / "report.json").read_text())["lost"] == 2
    assert (folder / "lost_in_logs.txt").read_text().startswith(f"== {a}: ")
    assert list((folder / "broker-logs").glob("node-1.log"))
    assert f"== {a}" in out.file.getvalue()  # printed too, not only written
