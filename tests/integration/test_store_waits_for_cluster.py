"""A store worker pointed at a ClickHouse cluster that does not answer waits, never exits
(issue 42, point 3). Real broker, real fetch and parse workers, a real site.

Before, a store start on a cluster ran ~35 ON CLUSTER statements; with a replica down each
waited for ``distributed_ddl_task_timeout`` and threw, and the store worker exited. Now it
runs none: it checks the schema, and while the server is unreachable, silent or erroring it
says ``store_waiting`` with the reason and tries again with back-off, its input kept in
Kafka. No ClickHouse server can run here, so the server is a fault injector on 127.0.0.1
(it accepts and never answers, then answers every request with a distributed-DDL timeout):
nothing stands in for ClickHouse. "When it clears" is the same worker id pointed back at a
store that works (the embedded engine): every page the crawl made meanwhile is stored, once.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest
from fleet_helpers import (
    Workers,
    committed_offsets,
    create_all_topics,
    page_counts,
    publish_seeds,
    report,
    stage_lags,
    stored_pages,
    wait_drained,
    wait_until,
)

from core.config import Settings
from infra.topics import topology_of
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

#: What a ClickHouse server answers when an ON CLUSTER statement outlived its wait for a host.
DDL_TIMEOUT = (b"HTTP/1.1 500 Internal Server Error\r\n"
               b"X-ClickHouse-Exception-Code: 159\r\nContent-Type: text/plain\r\n"
               b"Content-Length: 120\r\nConnection: close\r\n\r\n" +
               b"Code: 159. DB::Exception: Distributed DDL task is not finished on 1 of 4 "
               b"hosts after 180 seconds. (TIMEOUT_EXCEEDED)".ljust(120))


class FaultServer:
    """A TCP server on 127.0.0.1 that is a faulty ClickHouse: ``hang`` (accept, read, never
    answer) or ``error`` (answer each request with :data:`DDL_TIMEOUT`)."""

    def __init__(self, port: int) -> None:
        self.mode = "hang"
        self.connections = 0
        self._held: list[socket.socket] = []
        self._sock = socket.create_server(("127.0.0.1", port))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            if self.mode == "hang":
                self._held.append(conn)  # read nothing, answer nothing, keep it open
                continue
            conn.settimeout(2)
            try:
                conn.recv(65536)
                conn.sendall(DDL_TIMEOUT)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._sock.close()


def test_a_store_worker_waits_through_a_silent_then_failing_cluster_and_stores_after(
        settings: Settings, fleet: Callable[[Settings], Workers], site_port: int) -> None:
    hosts = ("127.0.0.2", "127.0.0.3")
    n_per_host = 15
    fault = FaultServer(free_port(("127.0.0.1",), 18900))
    dsn = f"http://crawler:s3cret-pw@127.0.0.1:{fault._sock.getsockname()[1]}/crawl"
    cluster_env = {"CRAWLFLEET_CLICKHOUSE_DSN": dsn, "CRAWLFLEET_CLICKHOUSE_CLUSTER": "crawl",
                   "CRAWLFLEET_CLICKHOUSE_TIMEOUT_S": "1"}
    try:
        with BehaviourSite(site_port, {h: Behaviour() for h in hosts}) as site:
            create_all_topics(settings)
            ws = fleet(settings)
            store = ws.start("store", "store-0", env=cluster_env)
            for stage in ("parse", "retry", "fetch"):
                ws.start(stage, f"{stage}-0")
            urls = [u for h in hosts for u in site.urls(h, n_per_host)]
            publish_seeds(settings, urls)

            def waiting_for(*words: str) -> Callable[[], bool]:
                def check() -> bool:
                    assert store.alive(), f"the store worker exited:\n{store.log_tail()}"
                    text = str(store.status().get("waiting") or "")
                    return store.gauge("store_waiting") == 1 and all(w in text for w in words)
                return check

            # 1. The server accepts and never answers: each try times out, and is retried.
            wait_until(waiting_for("unreachable"), 60, "the store worker to say it waits")
            tries_silent = fault.connections
            wait_until(lambda: waiting_for("unreachable")() and fault.connections
                       >= tries_silent + 3, 60, "the store worker to try again, and again")
            # 2. It answers every request with a distributed-DDL timeout: waited for too.
            fault.mode = "error"
            answered_from = fault.connections
            wait_until(waiting_for("159", "TIMEOUT_EXCEEDED"), 60,
                       "the store worker to wait on the DDL timeout")
            wait_until(lambda: waiting_for("159")() and fault.connections
                       >= answered_from + 3, 60, "the store worker to keep trying")
            # The crawl went on upstream; nothing was stored or committed: Kafka holds it.
            topo = topology_of(settings)
            wait_until(lambda: stage_lags(settings).get("store", 0) >= len(urls), 60,
                       "every parsed page to wait for the store in Kafka")
            committed = committed_offsets(settings, "store", [topo.parsed])
            assert all(o < 0 for o in committed.values()), committed
            status = store.status()
            assert status["counters"].get("store_retries", 0) >= 6, status["counters"]
            assert "s3cret-pw" not in store.log() + str(status)
            assert store.starts == 1 and store.alive()
            # 3. A stop while waiting is a clean stop; the same worker pointed back at a
            # store that works stores every page the crawl made meanwhile, once.
            store.stop(timeout=30)
            assert store.returncode() == 0, store.log_tail()
            tries = fault.connections
            ws.restart("store-0")
            wait_drained(settings, ws, 120, lambda: page_counts(settings).final >= len(urls))
            counts = page_counts(settings)
            stored = stored_pages(settings)
    finally:
        fault.close()
    report("store-waits-for-cluster", pages=counts.final, raw_rows=counts.raw,
           tries_while_silent=answered_from - tries_silent + 1,
           tries_while_erroring=tries - answered_from)
    assert counts.final == counts.urls == counts.keys == len(urls), counts
    assert set(stored) == set(urls) and set(stored.values()) == {200}
    assert "Traceback" not in ws.all["store-0"].log(), ws.all["store-0"].log_tail(80)


def test_a_store_write_the_server_refuses_is_waited_for_and_written_again(
        settings: Settings, fleet: Callable[[Settings], Workers], site_port: int) -> None:
    """Every second write fails after its first table went in, as a server whose replica
    went away mid-batch fails it (the fault point ``store_unavailable``): the store worker
    says so, keeps the batch's offsets uncommitted, probes the store, rejoins and writes
    the batch again. It never exits, and every page is stored once."""
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    with BehaviourSite(site_port, {h: Behaviour() for h in hosts}) as site:
        create_all_topics(settings)
        ws = fleet(settings)
        # small batches: many writes, every second one refused
        ws.start_pipeline(fetch=1, store_0={"CRAWLFLEET_FAULT": "store_unavailable:%2",
                                            "CRAWLFLEET_STORE_BATCH_ROWS": "10"})
        urls = [u for h in hosts for u in site.urls(h, 20)]
        publish_seeds(settings, urls)
        store = ws.all["store-0"]
        wait_drained(settings, ws, 120, lambda: page_counts(settings).final >= len(urls))
        counts = page_counts(settings)
        stored = stored_pages(settings)
    log = store.log()
    failed = log.count("crawlfleet fault injection: failing store_unavailable")
    report("store-write-refused", pages=counts.final, raw_rows=counts.raw,
           failed_writes=failed, retries=store.counter("store_retries"))
    assert store.alive() and store.starts == 1
    assert failed >= 3 and store.counter("store_retries") >= failed
    assert store.counter("fenced") == 0  # a store failure, not a lost session
    assert counts.final == counts.urls == counts.keys == len(urls), counts
    assert set(stored) == set(urls) and set(stored.values()) == {200}
    assert store.gauge("store_waiting") == 0 and not store.status()["waiting"]
