"""Fixtures for tests against the real local Kafka broker and the real chDB engine.

One single-node broker serves the whole session on a port of its own (28092), with its own
home under ``.crawlfleet/test-kafka``; each test isolates itself with a unique topic prefix
(topics and consumer groups) and a temporary data dir (chDB store). Nothing is mocked and
nothing is skipped: if the broker cannot start, the tests fail and say why.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_helpers import Proxy, Workers

from core.config import Settings, load_settings
from core.errors import InfraError
from crawlfleet.crawl import Fleet, Plan
from infra import kafka_local
from infra.topics import create_topics, delete_topics
from sites.demo_server import free_port

REPO = Path(__file__).resolve().parents[2]
# Below the ephemeral port range, like every broker port here. Two checkouts testing at
# once (a worktree beside main) each pick their own with TEST_KAFKA_PORT.
TEST_PORT = int(os.environ.get("TEST_KAFKA_PORT", "28092"))
# The user's noted local broker (infra/broker_note.py) is never the tests' to read or write:
# every process of this session notes brokers in a folder of its own.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="crawlfleet-state-")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real broker for the session; stopped at the end if this session started it.

    Concurrent test sessions on one machine share it (each test has its own topics), so a
    session that found it running leaves it running for the others.
    """
    jars = kafka_local.ensure_jars()  # the per-user cache: resolved once per pom
    home = REPO / ".crawlfleet" / "test-kafka"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kafka_local.JARS_ENV, str(jars))
        was_running = kafka_local.status(home).running
        bootstrap = kafka_local.up(nodes=1, base_dir=home, base_port=TEST_PORT, heap_mb=512)
        try:
            yield bootstrap
        finally:
            if not was_running:
                kafka_local.down(home)


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Settings for one test: its own topics, groups and chDB store.

    The topics are deleted afterwards, so the session's broker does not slow down as the
    suite piles up partitions.
    """
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    s = load_settings(bootstrap_servers=kafka_bootstrap, data_dir=tmp_path / "data",
                      topic_prefix=f"t{uuid.uuid4().hex[:10]}.", allow_private=True,
                      partitions=4, rate_cap=20.0)
    yield s
    with contextlib.suppress(InfraError):  # the broker went away with the test: nothing to tidy
        delete_topics(s, timeout_s=10)


@pytest.fixture
def site_port() -> int:
    # Every loopback host a test may serve on (sites use up to 8 hosts, .2-.9).
    return free_port(tuple(f"127.0.0.{i}" for i in range(2, 10)), 18600)


@pytest.fixture
def fleet_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Fleet]]:
    """Starts a :class:`Fleet` (one process per stage) on provisioned topics; stops them all."""
    fleets: list[Fleet] = []

    def make(settings: Settings, plan: Plan | None = None) -> Fleet:
        create_topics(settings)
        fleet = Fleet(settings, plan or Plan(), tmp_path_factory.mktemp("logs"))
        fleet.start()
        fleets.append(fleet)
        return fleet

    yield make
    for f in fleets:
        f.stop(10)


@pytest.fixture
def fleet() -> Iterator[Callable[[Settings], Workers]]:
    """Makes a :class:`Workers` for (adjusted) settings; kills every process at the end."""
    made: list[Workers] = []

    def make(settings: Settings) -> Workers:
        w = Workers(settings)
        made.append(w)
        return w

    try:
        yield make
    finally:
        for w in made:
            w.close()


@pytest.fixture
def tagged_proxies(tmp_path: Path) -> Iterator[tuple[Proxy, Proxy]]:
    """Two real forward proxies (proxy.py), tagged px1 and px2 so a site sees which one
    carried each request."""
    pair = (Proxy(tmp_path / "px1.log", tag="px1"), Proxy(tmp_path / "px2.log", tag="px2"))
    try:
        for p in pair:
            p.wait_ready()
        yield pair
    finally:
        for p in pair:
            p.stop()
