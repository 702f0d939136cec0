"""The quarantine app (faust-streaming) on the real broker, as a real process.

Fetch events are produced the way fetch workers produce them (confluent-kafka transactions,
partitioned by target), some in an aborted transaction, some repeated. What the app writes
to ``crawl.control`` is read back, and the store worker's ``quarantines`` table and the
dashboard view are read from chDB.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from fleet_helpers import Workers, create_all_topics, query, read_topic, wait_until

from core.config import Settings
from crawlfleet.crawl import settings_env
from infra.topics import topology_of
from infra.views import expand, load_views
from schemas.codec import default_codec
from schemas.records import Control, FetchEvent
from streams.control import Quarantine
from streams.io import Encoder, producer_conf

pytestmark = pytest.mark.integration

A, B, C = "a.test", "b.test", "c.test"
UA = "crawlfleet-test/1.0 (+https://example.org/bot)"
PROFILES = {p: {"user_agent": UA, "region": "local"} for p in ("alpha", "beta", "gamma")}


def _event(eid: str, target: str, profile: str, egress: str, ts_ms: int,
           outcome: str = "blocked") -> FetchEvent:
    return {"url": f"http://{target}/{eid}", "target": target, "profile": profile,
            "attempt": 0, "status": 403 if outcome == "blocked" else 200, "outcome": outcome,
            "reason": "http_403" if outcome == "blocked" else "ok", "elapsed_ms": 5,
            "bytes": 0, "worker": "fetch-test", "fetcher_version": "t", "http_version": "t",
            "tls_version": "t", "profile_bundle_version": "1", "code_revision": "t",
            "ts_ms": ts_ms, "event_id": eid, "egress": egress}


class Telemetry:
    """Produces fetch events in transactions, as a fetch worker does (its producer
    settings: lz4-compressed batches, which the app's consumer must be able to read)."""

    def __init__(self, s: Settings) -> None:
        self.topo = topology_of(s)
        self.enc = Encoder(self.topo, "fetch-test")
        self.p = Producer(producer_conf(s, "fetch-test", f"qt-{uuid.uuid4().hex}"))
        self.p.init_transactions(30)
        self.committed = 0

    def txn(self, events: list[FetchEvent], commit: bool = True) -> None:
        self.p.begin_transaction()
        for e in events:
            out = self.enc.record(self.topo.blocks, e["target"], e["url"].encode(), e)
            assert out.value is not None
            self.p.produce(out.topic, out.value, out.key, partition=out.partition,
                           headers=out.headers)
        self.p.flush(30)
        if commit:
            self.p.commit_transaction(30)
            self.committed += len(events)
        else:
            self.p.abort_transaction(30)


def _quarantines(s: Settings) -> tuple[dict[str, Quarantine], Counter[str]]:
    """Quarantines on crawl.control by key, and how many records each key has."""
    topo = topology_of(s)
    codec = default_codec()
    found: dict[str, Quarantine] = {}
    counts: Counter[str] = Counter()
    for r in read_topic(s, topo.control):
        key = (r.key or b"").decode()
        if not key.startswith("quarantine:"):
            continue
        counts[key] += 1
        if r.value is None:  # a tombstone: lifted
            found.pop(key, None)
            continue
        q = Quarantine.of(codec.decode_as(Control, r.value, r.headers))
        assert q is not None, key
        found[key] = q
    return found, counts


def test_quarantine_app_counts_committed_distinct_blocks(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    s = settings.replace(profiles=PROFILES, default_profile="alpha", quarantine_blocks=3,
                         quarantine_window_s=600.0, quarantine_s=1800.0)
    create_all_topics(s)
    ws = fleet(s)
    app = ws.start("quarantine", "quarantine-0")
    tel = Telemetry(s)
    t0 = int(time.time() * 1000) - 120_000
    ev: dict[str, FetchEvent] = {}

    def e(eid: str, target: str, profile: str, egress: str, outcome: str = "blocked"
          ) -> FetchEvent:
        ev[eid] = _event(eid, target, profile, egress, t0 + 1000 * len(ev), outcome)
        return ev[eid]

    # Phase 1: two blocks of (A, alpha) on three egresses, two of egress px9 on A (beta,
    # gamma), two of (B, alpha), two of (C, alpha) -- all one short of N = 3.
    first = [e("a1", A, "alpha", "direct"), e("a2", A, "alpha", "px1"),
             e("e1", A, "beta", "px9"), e("e2", A, "gamma", "px9"),
             e("b1", B, "alpha", "direct"), e("b2", B, "alpha", "direct"),
             e("c1", C, "alpha", "direct"), e("c2", C, "alpha", "direct")]
    tel.txn(first)
    # Aborted: had these counted, (A, alpha), (B, alpha), (A, px9) and (C, alpha) would
    # each reach 3.
    tel.txn([e("x1", A, "alpha", "direct"), e("x2", B, "alpha", "direct"),
             e("x3", A, "gamma", "px9"), e("x4", C, "alpha", "direct")], commit=False)
    # Repeated (a replay) and a success: counted once, and a success is no block.
    tel.txn([*first, e("ok1", A, "alpha", "direct", "ok"), e("ok2", B, "alpha", "direct", "ok")])
    wait_until(lambda: app.counter("events") >= tel.committed, 90,
               f"the app to read {tel.committed} events")
    time.sleep(1.0)  # anything it would issue is published before its next event is read
    # Read_committed: only committed events were delivered to the app (x1..x4 never were).
    assert app.counter("events") == tel.committed == 18
    assert app.counter("blocks") == 16
    found, _ = _quarantines(s)
    assert found == {}, f"issued below N: {found}"

    # Phase 2: the third distinct block of (A, alpha) and of (A, px9); C blocks everything.
    tel.txn([e("a3", A, "alpha", "px2"), e("e3", A, "beta", "px9"),
             e("c3", C, "alpha", "direct"), e("c4", C, "beta", "direct"),
             e("c5", C, "beta", "direct"), e("c6", C, "beta", "direct"),
             e("c7", C, "gamma", "direct")])
    want = {"quarantine:profile:a.test|alpha", "quarantine:egress:a.test|px9",
            "quarantine:profile:c.test|alpha", "quarantine:egress:c.test|direct",
            "quarantine:profile:c.test|beta", "quarantine:target:c.test|"}
    wait_until(lambda: set(_quarantines(s)[0]) >= want, 60,
               f"the quarantines {sorted(want)}")
    wait_until(lambda: app.counter("events") >= tel.committed, 30, "the app to catch up")
    time.sleep(1.0)
    found, counts = _quarantines(s)
    assert set(found) == want  # nothing for (A, beta) (2 blocks), for B, or for px1/px2
    assert set(counts.values()) == {1}, counts  # a repeat while active is not issued again
    qa = found["quarantine:profile:a.test|alpha"]
    assert qa.until_ms == ev["a3"]["ts_ms"] + 1_800_000  # at the third block's own time
    assert "3 blocks" in qa.reason
    pause = found["quarantine:target:c.test|"]
    # C's only egress is blamed once two profiles (alpha, beta) were refused through it (c4),
    # which leaves all three profiles without a way out: the target pauses at that event.
    assert "3 of 3 profiles" in pause.reason and pause.until_ms == ev["c4"]["ts_ms"] + 1_800_000

    # A crash and a replay: the app restarts from its committed offsets and its table's
    # changelog; the same events again issue nothing new.
    app.kill()
    app = ws.restart("quarantine-0")
    tel.txn([ev[i] for i in ("a1", "a2", "a3", "e3", "c3", "c4", "c5", "c6")])
    wait_until(lambda: app.counter("events") >= 8, 90, "the restarted app to read the replay")
    seen = [-1]  # and nothing more arriving for 2 s (it may also replay uncommitted events)

    def settled() -> bool:
        now = app.counter("events")
        if now != seen[0]:
            seen[0] = now
            return False
        return True
    wait_until(settled, 30, "the restarted app to settle", interval=2.0)
    assert _quarantines(s)[1] == counts

    # The store keeps every quarantine once, with its second-order flag; the view counts them.
    ws.start("store", "store-0")
    ws.wait_store_ready()
    sql = ("SELECT target, scope, name, second_order, blocks FROM quarantines FINAL "
           "ORDER BY target, scope, name")
    wait_until(lambda: len(query(s, sql)) >= 6, 60, "the quarantines in the store")
    rows = query(s, sql)
    assert [tuple(r) for r in rows] == [
        (A, "egress", "px9", 0, 3), (A, "profile", "alpha", 0, 3),
        (C, "egress", "direct", 0, 4),  # 4 blocks, of two profiles; not a profile: no cascade
        (C, "profile", "alpha", 0, 3), (C, "profile", "beta", 1, 3),  # after alpha: one
        (C, "target", "", 0, 3)]
    view = load_views()["quarantines"]
    got: dict[str, Any] = {r[0]: r for r in query(s, expand(view.sql, 3600))}
    assert set(got) == {A, C}
    assert (got[A][1], got[A][2]) == (2, 0)  # quarantines, second order
    assert (got[C][1], got[C][2]) == (4, 1)

    # A person lifts the target pause (the runbook's way): a tombstone on crawl.control.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")},
           **settings_env(s)}
    out = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "unquarantine", C],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    left, _ = _quarantines(s)
    assert set(left) == want - {"quarantine:target:c.test|"}


def test_quarantine_app_is_held_by_the_approved_set(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """An unapproved build neither consumes nor publishes quarantines; approved, it issues
    them from the events it held; revoked while running, it stops issuing; approved again,
    a fresh app goes on from the committed offsets (issue 41, point 4)."""
    from core.versions import VersionTuple, worker_tuple
    from producers.control import approve, revoke
    s = settings.replace(profiles=PROFILES, default_profile="alpha", quarantine_blocks=2,
                         quarantine_window_s=600.0, quarantine_s=1800.0,
                         code_revision="rev-quarantine")
    create_all_topics(s)
    mine = worker_tuple(s)
    approve(s, [VersionTuple(mine.bundle, mine.http, mine.tls, "another-build")])
    ws = fleet(s)
    app = ws.start("quarantine", "quarantine-0")
    wait_until(lambda: app.gauge("refused") == 1, 30, "the app to report its refusal")
    assert str(mine) in app.status()["waiting"]
    tel = Telemetry(s)
    t0 = int(time.time() * 1000) - 60_000
    tel.txn([_event("a1", A, "alpha", "direct", t0), _event("a2", A, "alpha", "px1", t0 + 1)])
    time.sleep(3.0)  # a refused app that consumed would have issued (A, alpha) by now
    assert app.counter("events") == 0
    assert _quarantines(s)[0] == {}

    approve(s, [mine])
    wait_until(lambda: "quarantine:profile:a.test|alpha" in _quarantines(s)[0], 60,
               "the approved app to issue the held quarantine")
    assert app.gauge("refused") == 0

    revoke(s, mine)
    wait_until(lambda: app.gauge("refused") == 1, 30, "the app to see the revocation")
    seen = app.counter("events")
    tel.txn([_event("b1", B, "alpha", "direct", t0 + 2),
             _event("b2", B, "alpha", "px1", t0 + 3)])
    time.sleep(3.0)
    assert "quarantine:profile:b.test|alpha" not in _quarantines(s)[0]
    assert app.counter("events") == seen  # nothing of B was handled

    approve(s, [mine])
    wait_until(lambda: "quarantine:profile:b.test|alpha" in _quarantines(s)[0], 60,
               "the re-approved app to issue B's quarantine")
    assert app.alive()
    found, counts = _quarantines(s)
    assert set(found) == {"quarantine:profile:a.test|alpha", "quarantine:profile:b.test|alpha"}
    assert set(counts.values()) == {1}
