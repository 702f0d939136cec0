"""Real-process tests for infra.kafka_local: real JVMs, real sockets, no mocks.

Each test gets its own temporary Kafka home and non-default ports (29092, 29192) so a developer's
cluster on 19092 is never touched. Jars are resolved once into the normal home
($CRAWLFLEET_HOME/kafka/jars) unless CRAWLFLEET_KAFKA_JARS already points at a jar dir, and shared
through that variable, so temporary homes never re-download.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

# 2.16's typed admin package re-exports NewTopic without marking it public.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from core.errors import InfraError
from infra import kafka_local

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SINGLE_PORT = 29092
TRIPLE_PORT = 29192


@pytest.fixture(scope="session")
def kafka_jars() -> Iterator[Path]:
    """One jar dir for the whole session, exported so every temporary home reuses it."""
    if shutil.which("java") is None:  # CI must not pass by skipping: fail loudly
        pytest.fail(f"java not on PATH ({kafka_local.INSTALL_HINT})")
    jars = Path(os.environ.get(kafka_local.JARS_ENV) or kafka_local.ensure_jars())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kafka_local.JARS_ENV, str(jars))
        yield kafka_local.ensure_jars()


def _alive(pid: int) -> bool:
    """A pid counts as alive unless it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _pids(home: Path) -> list[int]:
    pids = [node.pid for node in kafka_local.status(home).nodes]
    assert all(pid is not None for pid in pids)
    return [pid for pid in pids if pid is not None]


def _create_topic(bootstrap: str, name: str, partitions: int, replication: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, replication)], operation_timeout=30)
    futures[name].result(timeout=60)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[KafkaError]:
    """Produce with acks=all; return delivery errors (empty on success)."""
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value, on_delivery=on_delivery)
    assert producer.flush(90) == 0, "messages still undelivered after 90s"
    return errors


def _consume(bootstrap: str, topic: str, count: int, timeout_s: float = 60.0) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            value = None if msg is None or msg.error() else msg.value()
            if value is not None:
                got.append(value)
    finally:
        consumer.close()
    return got


def _up_in_subprocess(home: Path, nodes: int, port: int) -> str:
    """Start from a separate interpreter that exits: the brokers must outlive it."""
    code = (
        "import sys; from pathlib import Path; from infra.kafka_local import up; "
        f"print(up({nodes}, base_dir=Path(sys.argv[1]), base_port={port}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(home)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_single_node_lifecycle(tmp_path_factory: pytest.TempPathFactory, kafka_jars: Path) -> None:
    home = tmp_path_factory.mktemp("kafka1")
    try:
        bootstrap = _up_in_subprocess(home, 1, SINGLE_PORT)
        assert bootstrap == f"127.0.0.1:{SINGLE_PORT}"
        st = kafka_local.status(home)
        assert st.running and st.bootstrap_servers == bootstrap
        pids = _pids(home)

        _create_topic(bootstrap, "roundtrip", 1, 1)
        assert _produce(bootstrap, "roundtrip", [b"hello"]) == []
        assert _consume(bootstrap, "roundtrip", 1) == [b"hello"]

        assert kafka_local.up(1, base_dir=home, base_port=SINGLE_PORT) == bootstrap
        assert _pids(home) == pids, "a second up must adopt the running broker"
        assert kafka_local.status(home).running
        with pytest.raises(InfraError, match="kafka down"):
            kafka_local.up(3, base_dir=home, base_port=SINGLE_PORT)
    finally:
        kafka_local.down(home)

    st = kafka_local.status(home)
    assert not st.running and all(node.pid is None for node in st.nodes)
    assert not any(_alive(pid) for pid in pids)
    shown = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "kafka", "status", "--dir",
                            str(home)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 1 and "node 1: stopped" in shown.stdout
    assert "None" not in shown.stdout, shown.stdout
    assert (home / "node-1" / "data" / "meta.properties").exists(), "down keeps data"


def test_three_nodes_survive_a_killed_broker(
    tmp_path_factory: pytest.TempPathFactory, kafka_jars: Path
) -> None:
    home = tmp_path_factory.mktemp("kafka3")
    try:
        bootstrap = kafka_local.up(3, base_dir=home, base_port=TRIPLE_PORT)
        assert bootstrap.count(",") == 2
        _create_topic(bootstrap, "chaos", 3, 3)
        assert _produce(bootstrap, "chaos", [b"before"]) == []

        kafka_local.stop_node(2, base_dir=home, hard=True)
        st = kafka_local.status(home)
        assert [n.running for n in st.nodes] == [True, False, True]
        assert not st.running

        after = [f"after-{i}".encode() for i in range(20)]
        assert _produce(bootstrap, "chaos", after) == [], "acks=all must succeed with ISR 2 of 3"

        kafka_local.start_node(2, base_dir=home)
        assert kafka_local.status(home).running
        assert sorted(_consume(bootstrap, "chaos", 21)) == sorted([b"before", *after])
    finally:
        kafka_local.down(home)
    assert not any(n.running for n in kafka_local.status(home).nodes)
