"""A local broker's port held by another program is one error naming the way out (issue 44):
use the broker that holds it (``--bootstrap``), or one home for every folder
(``CRAWLFLEET_HOME``), instead of "use another base port", which no option set."""

from __future__ import annotations

import socket

import pytest

from core.errors import InfraError
from infra.kafka_home import HOST, _Cluster
from infra.kafka_local import _check_ports


def test_a_taken_broker_port_names_bootstrap_and_home() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((HOST, 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(InfraError) as err:
            _check_ports(_Cluster(1, port, "id", 512, ""), 1, grace_s=0)
    text = str(err.value)
    assert f"port {HOST}:{port} for Kafka node 1 is taken" in text
    assert f"--bootstrap {HOST}:{port}" in text and "CRAWLFLEET_HOME" in text
