"""Every stage started before its broker answers waits for it, says "waiting for Kafka at
X", and starts as soon as it can (real broker behind a loopback TCP forwarder that opens
late, real worker processes, real chDB).

Before, parse and retry exited after 30 s ("kafka error: Timed out"), fetch logged "lost
its transaction, rejoining" in a loop, and store said nothing at all.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    report,
    wait_drained,
    wait_until,
)

from core.config import Settings
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

HOST = "127.0.0.2"
STAGES = ("store", "parse", "retry", "fetch")


class Forwarder:
    """127.0.0.1:``port`` -> the broker, once :meth:`open` is called (refused before)."""

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        self.port, self.upstream = port, upstream
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def open(self) -> None:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", self.port), self._loop).result(10)

    def close(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def test_every_stage_waits_for_kafka_and_then_starts(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    create_all_topics(settings)
    host, port = settings.bootstrap_servers.rsplit(":", 1)
    proxy_port = free_port(("127.0.0.1",), 19500)
    where = f"127.0.0.1:{proxy_port}"
    late = settings.replace(bootstrap_servers=where)
    forwarder = Forwarder(proxy_port, (host, int(port)))
    ws = fleet(late)
    with BehaviourSite(site_port, {HOST: Behaviour()}) as site:
        try:
            for stage in STAGES:
                ws.start(stage, f"{stage}-0")
            began = time.monotonic()

            def all_waiting() -> bool:
                for w in ws.all.values():
                    assert w.alive(), f"{w.wid} exited:\n{w.log_tail()}"
                return all(f"waiting for Kafka at {where}" in w.log()
                           and w.status().get("waiting", "").startswith(f"Kafka at {where}")
                           for w in ws.all.values())

            wait_until(all_waiting, 30, "every stage to say it waits for Kafka")
            said_in = time.monotonic() - began
            time.sleep(5)  # and keep waiting, alive, for as long as it takes
            assert all(w.alive() for w in ws.all.values()), ws.logs()
            assert all(w.gauge("kafka_waiting") == 1 for w in ws.all.values())

            forwarder.open()
            opened = time.monotonic()
            wait_until(lambda: all(w.alive() and not w.status().get("waiting")
                                   and w.gauge("kafka_waiting") == 0
                                   for w in ws.all.values()), 60,
                       "every stage to start once Kafka answers")
            started_in = time.monotonic() - opened
            publish_seeds(settings, site.urls(HOST, 5))
            wait_drained(late, ws, 120, lambda: page_counts(settings).final >= 5)
            assert page_counts(settings).final == 5
        finally:
            ws.close()
            forwarder.close()
    report("wait-for-kafka", said_waiting_s=round(said_in, 2),
           started_after_kafka_s=round(started_in, 2))


def test_every_stage_started_before_its_topics_waits_for_them_and_then_starts(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    """A crawl starts its workers while it makes its topics, and a deployment may start
    them before ``crawlfleet topics create``: each waits for its topics, says so once the
    wait is long, and joins its group when they exist (none exits, none joins early)."""
    ws = fleet(settings)
    with BehaviourSite(site_port, {HOST: Behaviour()}) as site:
        try:
            for stage in STAGES:
                ws.start(stage, f"{stage}-0")

            def all_waiting() -> bool:
                for w in ws.all.values():
                    assert w.alive(), f"{w.wid} exited:\n{w.log_tail()}"
                return all("waiting for its topics" in w.log()
                           and w.status().get("waiting", "").startswith("topics: ")
                           and w.gauge("topics_waiting") == 1 for w in ws.all.values())

            wait_until(all_waiting, 30, "every stage to say it waits for its topics")
            assert all(w.status().get("rebalances", 0) == 0 for w in ws.all.values())
            create_all_topics(settings)
            wait_until(lambda: all(w.alive() and not w.status().get("waiting")
                                   and w.gauge("topics_waiting") == 0
                                   and w.status().get("rebalances", 0) > 0
                                   for w in ws.all.values()), 60,
                       "every stage to join its group once its topics exist")
            publish_seeds(settings, site.urls(HOST, 5))
            wait_drained(settings, ws, 120, lambda: page_counts(settings).final >= 5)
            assert page_counts(settings).final == 5
        finally:
            ws.close()
