"""The broker faults the soak injects, on a real one-node cluster of the test's own.

A frozen broker (SIGSTOP) is not a dead one: its process and sockets stay, and nothing
answers until SIGCONT. A whole-cluster restart kills every node at once, a frozen one too,
and brings them all back on their data. The cluster runs on the soak's own port series,
never the shared test broker's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from chaos.cluster import SOAK_BASE_PORT, chaos_cluster
from infra import kafka_local

pytestmark = pytest.mark.integration


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _topics(bootstrap: str, timeout: float) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms":
                         2000})
    return set(admin.list_topics(timeout=timeout).topics)


def test_a_frozen_broker_answers_nothing_and_a_restart_of_all_brings_it_back(
        tmp_path: Path) -> None:
    home = tmp_path / "kafka"
    with chaos_cluster(home, 1, SOAK_BASE_PORT[1]) as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(30)
        pid = kafka_local.node_pid(1, home)
        assert pid is not None
        assert kafka_local.freeze_node(1, home) == pid
        try:
            assert _state(pid) == "T"  # stopped, not gone
            assert kafka_local.node_pid(1, home) == pid  # and still counted as running
            with pytest.raises(KafkaException):
                _topics(bootstrap, timeout=3)
        finally:
            kafka_local.thaw_node(1, home)
        assert _state(pid) != "T"
        assert "kept" in _topics(bootstrap, timeout=30)
        kafka_local.freeze_node(1, home)  # a frozen node must not survive a restart of all
        kafka_local.restart_all(home, hard=True, down_s=0.5)
        again = kafka_local.node_pid(1, home)
        assert again is not None and again != pid
        assert not Path(f"/proc/{pid}").exists() or _state(pid) in ("Z", "X")
        assert "kept" in _topics(bootstrap, timeout=30)  # back on its data
    assert kafka_local.node_pid(1, home) is None
