"""Bad input mid-crawl, on real parts: undecodable records in every stage's input, and a page
whose handling raises. Each becomes one dead letter with its reason; the crawl goes on and
every good page is stored."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import Producer
from fleet_helpers import (
    CountingServer,
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    query,
    read_topic,
    report,
    stage_lags,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from core.errors import DecodeError
from infra.topics import topology_of
from schemas.codec import default_codec
from schemas.topics import HEADER_SCHEMA
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

HOST = "127.0.0.8"
PAGES = 12


def _site_routes() -> dict[str, tuple[int, bytes]]:
    """An index linking to PAGES pages, each linking to the next and back to the index."""
    links = "".join(f'<a href="/p{i}.html">p{i}</a>' for i in range(PAGES))
    routes = {"/": (200, f"<html><head><title>index</title></head><body>{links}</body>"
                         "</html>".encode())}
    for i in range(PAGES):
        routes[f"/p{i}.html"] = (200, (
            f"<html><head><title>p{i}</title></head><body><p>page {i}</p>"
            f'<a href="/p{(i + 1) % PAGES}.html">next</a><a href="/">home</a>'
            "</body></html>").encode())
    return routes


def _garbage(record: str, rng: random.Random) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """Records no reader can decode: no schema header, an unknown or non-UTF-8 one, and
    random bytes under each real writer schema of ``record`` (checked to fail)."""
    codec = default_codec()
    out: list[tuple[bytes, list[tuple[str, bytes]]]] = [
        (rng.randbytes(40), []),
        (rng.randbytes(40), [(HEADER_SCHEMA, rng.randbytes(8).hex().encode())]),
        (rng.randbytes(40), [(HEADER_SCHEMA, b"\x80\xff not utf-8")]),
    ]
    for version in codec.versions(record):
        headers = [(HEADER_SCHEMA, version.fingerprint.encode())]
        while True:
            payload = rng.randbytes(rng.randint(1, 64))
            try:
                codec.decode(record, payload, headers)
            except DecodeError:
                break
        out.append((payload, headers))
    return out


def _unstorable(record: str) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """Records that decode, with a value their table cannot hold (a negative count)."""
    now = datetime.now(UTC)
    values: dict[str, dict[str, Any]] = {
        "ParsedPage": {"dedupe_key": "k", "url": "http://x.test/", "final_url": "",
                       "target": "x.test", "profile": "default", "depth": -1, "status": 200,
                       "content_type": "", "title": "", "text": "", "links": [],
                       "body_bytes": 0, "fetched_at_ms": now, "fetch_worker": "",
                       "parse_worker": "", "body_z": b""},  # bytes: its JSON default is a str
        "FetchEvent": {"url": "http://x.test/", "target": "x.test", "profile": "default",
                       "attempt": -1, "status": 200, "outcome": "ok", "reason": "",
                       "elapsed_ms": 1, "bytes": 1, "worker": "", "fetcher_version": "",
                       "http_version": "", "tls_version": "", "profile_bundle_version": "",
                       "code_revision": "", "ts_ms": now},
        "DeadLetter": {"job": None, "raw": None, "source_topic": "x", "reason": "x",
                       "error": "", "attempts": -1, "worker": "", "version": "",
                       "failed_at_ms": now},
    }
    if record not in values:
        return []
    payload, headers = default_codec().encode(record, values[record])
    return [(payload, [(k, v if isinstance(v, bytes) else str(v).encode())
                       for k, v in headers])]


def _dead_letters(s: Settings) -> list[tuple[str, str, str, str, str]]:
    return [(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4])) for r in query(
        s, "SELECT event_id, source_topic, reason, url, raw FROM dead_letters FINAL")]


def test_undecodable_records_mid_crawl_become_dead_letters(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """Random bytes in crawl.frontier, crawl.fetched, crawl.parsed, crawl.telemetry and
    crawl.dead (and, for the store's inputs, records that decode but hold a value their
    table cannot), published while a crawl runs: each is one ``undecodable`` dead letter
    with its bytes, every one is also in crawl.dead (the store publishes those it cannot
    read), no stage stops, and every page of the site is stored."""
    port = free_port((HOST,), 19300)
    s = settings
    topo = topology_of(s)
    create_all_topics(s)
    ws = fleet(s)
    started = time.monotonic()
    delays = {f"/p{i}.html": 0.8 for i in range(PAGES)}  # keeps the crawl going a while
    with CountingServer(HOST, port, _site_routes(), delays) as site:
        expected = {site.url("/"): 200, **{site.url(f"/p{i}.html"): 200 for i in range(PAGES)}}
        ws.start_pipeline()
        publish_seeds(s, [site.url("/")])
        wait_until(lambda: page_counts(s).final >= 1, 60, "the crawl's first stored page")

        rng = random.Random(12)
        inputs = [topo.frontier, topo.fetched, topo.parsed, topo.telemetry, topo.dead]
        sent: dict[str, str] = {}  # raw hex -> topic
        p = Producer(s.kafka_common())
        for topic in inputs:
            record = topo.record_of(topic)
            for n, (payload, headers) in enumerate(_garbage(record, rng) + _unstorable(record)):
                p.produce(topic, value=payload, key=f"garbage-{n}|x|y".encode(),
                          partition=n % s.topic_partitions, headers=headers)
                sent[payload.hex()] = topic
        assert p.flush(10) == 0
        in_crawl = page_counts(s).final
        assert in_crawl < len(expected), "the garbage should land mid-crawl"

        def done() -> bool:
            undecodable = [d for d in _dead_letters(s) if d[2] == "undecodable"]
            return len(undecodable) >= len(sent) and page_counts(s).final == len(expected)

        wait_until(done, 90, "every garbage record dead-lettered and every page stored")
        drain_s = wait_drained(s, ws, 60)
        assert stored_pages(s) == expected
        counts = page_counts(s)
        assert counts.final == counts.urls == counts.keys == len(expected)

        dead = _dead_letters(s)
        undecodable = [d for d in dead if d[2] == "undecodable"]
        # Once each, from the topic it was sent to, with its bytes; nothing else dead.
        assert sorted((d[4], d[1]) for d in undecodable) == sorted(sent.items())
        assert all(d[3] == "" for d in undecodable)
        assert [d for d in dead if d[2] != "undecodable"] == []

        # crawl.dead is the complete record: a decodable dead letter for every garbage
        # record sent to a stage's input (the store's own included), besides the garbage
        # sent to crawl.dead itself.
        codec = default_codec()
        letters: list[tuple[str, str]] = []
        raw_in_dead = []
        for r in read_topic(s, topo.dead):
            if sent.get((r.value or b"").hex()) == topo.dead:  # what the test sent there
                raw_in_dead.append((r.value or b"").hex())
                continue
            v = codec.decode("DeadLetter", r.value, r.headers)  # a stage's dead letter
            letters.append(((v["raw"] or b"").hex(), v["source_topic"]))
        assert sorted(letters) == sorted((h, t) for h, t in sent.items() if t != topo.dead)
        assert sorted(raw_in_dead) == sorted(h for h, t in sent.items() if t == topo.dead)
        # The store's own dead letters are rows named by the record's place in its input.
        store_made = [d for d in undecodable if d[1] in (topo.parsed, topo.telemetry)]
        assert store_made and all(d[0].startswith((topo.parsed + ":", topo.telemetry + ":"))
                                  for d in store_made)
        assert all(w.alive() for w in ws.all.values()), ws.logs()
        assert stage_lags(s) == {"fetch": 0, "parse": 0, "store": 0, "retry": 0, "revisit": 0}
        assert ws.all["store-0"].counter("dead_published") == len(store_made)
        assert site.count("/") == 1

    report("undecodable", garbage=len(sent), pages=len(expected), stored_before=in_crawl,
           drain_s=round(drain_s, 1), total_s=round(time.monotonic() - started, 1))


def test_store_dead_letters_survive_a_replay_once(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """The store publishes dead letters for undecodable records, then dies before committing
    its offsets: the replay publishes them again, yet each is one row (its id is the
    record's place in crawl.parsed, not the dead letter's)."""
    s = settings
    topo = topology_of(s)
    create_all_topics(s)
    ws = fleet(s)
    store = ws.start("store", "store-0", env={"CRAWLFLEET_FAULT": "after_insert:1"})
    ws.wait_store_ready()
    rng = random.Random(7)
    garbage = _garbage(topo.record_of(topo.parsed), rng)[:2]
    p = Producer(s.kafka_common())
    for n, (payload, headers) in enumerate(garbage):
        p.produce(topo.parsed, value=payload, key=b"g", partition=n, headers=headers)
    assert p.flush(10) == 0
    assert store.wait_exit(60) == 137, store.log_tail()
    assert "dying at after_insert #1" in store.log()

    ws.restart("store-0")
    ws.wait_store_ready()
    sent = sorted(payload.hex() for payload, _ in garbage)

    def letters() -> list[str]:
        out = []
        for r in read_topic(s, topo.dead):
            v = default_codec().decode("DeadLetter", r.value, r.headers)
            out.append(v["raw"].hex())
        return sorted(out)

    wait_until(lambda: letters() == sorted(sent * 2), 60, "both dead letters published twice")
    wait_until(lambda: len(_dead_letters(s)) >= len(sent), 60, "the dead letters stored")
    time.sleep(1.5)  # the second copies are read and stored too
    dead = _dead_letters(s)
    assert sorted(d[4] for d in dead) == sent
    assert sorted(d[0] for d in dead) == sorted(f"{topo.parsed}:{n}:0"
                                                for n in range(len(garbage)))
    assert ws.all["store-0"].alive()


#: A parse worker whose extraction raises on one page (a bug nobody foresaw), then the CLI.
RAISING_PARSE_BOOT = """
import sys
import consumers.parse as parse
_extract = parse.extract
def extract(body, base_url, content_type="text/html"):
    if base_url.endswith("/p3.html"):
        raise ZeroDivisionError("planted failure")
    return _extract(body, base_url, content_type)
parse.extract = extract
from crawlfleet.cli import app
sys.argv[0] = "crawlfleet"
app()
"""


def test_page_whose_parse_raises_is_dead_lettered_as_internal(
        settings: Settings, fleet: Callable[[Settings], Workers]) -> None:
    """One page's parse raises an unexpected exception: that page becomes one ``internal``
    dead letter naming it and the exception type; the parse worker lives on and the rest of
    the crawl (but for the pages only that page links to) is stored."""
    port = free_port((HOST,), 19400)
    s = settings
    topo = topology_of(s)
    create_all_topics(s)
    ws = fleet(s)
    started = time.monotonic()
    routes = _site_routes()
    with CountingServer(HOST, port, routes) as site:
        boom = site.url("/p3.html")
        # Every page is linked from the index, so all are reached; p3 is fetched, not stored.
        expected = {site.url("/"): 200, **{site.url(f"/p{i}.html"): 200
                                           for i in range(PAGES) if i != 3}}
        for stage in ("store", "retry", "fetch"):
            ws.start(stage, f"{stage}-0")
        parse = ws.start("parse", "parse-0", boot=RAISING_PARSE_BOOT)
        ws.wait_store_ready()
        publish_seeds(s, [site.url("/")])

        def done() -> bool:
            internal = query(s, "SELECT count() FROM dead_letters FINAL "
                                "WHERE reason = 'internal'")[0][0]
            return int(internal) >= 1 and page_counts(s).final == len(expected)

        wait_until(done, 90, "the raising page dead-lettered and the rest stored")
        drain_s = wait_drained(s, ws, 60)
        assert stored_pages(s) == expected
        dead = query(s, "SELECT url, reason, error, source_topic, attempts, raw "
                        "FROM dead_letters FINAL")
        assert len(dead) == 1, dead
        url, reason, error, source, attempts, raw = dead[0]
        assert (url, reason, source, int(attempts)) == (boom, "internal", topo.fetched, 1)
        assert "ZeroDivisionError" in error and "planted failure" in error and boom in error
        assert raw, "the FetchResult's bytes are kept for inspection"
        assert site.count("/p3.html") == 1, "dead-lettered, not retried"
        assert parse.alive() and parse.counter("internal") == 1, parse.log_tail()
        assert parse.counter("dead") == 1  # the crawl's progress table counts it
        assert "ZeroDivisionError" in parse.log()
        assert all(w.alive() for w in ws.all.values()), ws.logs()

    report("internal", pages=len(expected), drain_s=round(drain_s, 1),
           total_s=round(time.monotonic() - started, 1))
