"""The Kafka cluster a chaos run owns: its own home, its own ports, always stopped after.

A chaos run kills and freezes brokers, so it never uses a broker anyone else relies on
(the shared test broker on 28092, a colleague's ``kafka up`` on 19092): it starts 1 or 3
nodes of its own under its data folder, on the first free base port of its own series.
Ports lie below Linux's ephemeral range (32768-60999): a client reconnecting to a killed
broker's port could otherwise be handed that very port as its own source port (a
self-connect) and hold it, so the broker could not bind it again on restart.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from core.errors import InfraError
from infra import kafka_local

#: First base port of a one-off chaos run's cluster by node count (the tests' defaults).
BASE_PORT = {1: 21092, 3: 21192}
#: The soak's series starts above them, so a soak never takes a test's ports.
SOAK_BASE_PORT = {1: 21492, 3: 21392}
#: Candidates step by this much: the 1- and 3-node series interleave and never overlap.
PORT_STEP = 200
CANDIDATES = 8


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((kafka_local.HOST, port))
        except OSError:
            return False
    return True


def _listened(port: int) -> bool:
    with contextlib.suppress(OSError), \
            socket.create_connection((kafka_local.HOST, port), timeout=0.5):
        return True
    return False


def _ports(base_port: int, nodes: int) -> list[int]:
    return [kafka_local.broker_port(base_port, n) + k for n in range(1, nodes + 1)
            for k in (0, 1)]


def pick_base_port(nodes: int, first: int, timeout_s: float = 75.0) -> int:
    """The first base port of the series from ``first`` whose ports are all free.

    Sockets that merely linger on a port (TIME_WAIT lasts 60 s) do not count against it;
    when every candidate is taken, wait for the first one up to ``timeout_s``.
    """
    candidates = [first + PORT_STEP * k for k in range(CANDIDATES)]
    for base in candidates:
        ports = _ports(base, nodes)
        if all(_bindable(p) and not _listened(p) for p in ports):
            return base
    deadline = time.monotonic() + timeout_s
    base = candidates[0]
    while time.monotonic() < deadline:
        if all(_bindable(p) for p in _ports(base, nodes)):
            return base
        time.sleep(1.0)
    raise InfraError(f"no free ports for a {nodes}-node cluster from {first} on "
                     f"(every {PORT_STEP}th, {CANDIDATES} tries)")


@contextlib.contextmanager
def chaos_cluster(home: Path, nodes: int, first_port: int) -> Iterator[str]:
    """A fresh ``nodes``-node cluster under ``home`` for the block; its bootstrap servers."""
    saved_jars = os.environ.get(kafka_local.JARS_ENV)
    try:
        if not saved_jars:
            os.environ[kafka_local.JARS_ENV] = str(kafka_local.ensure_jars())
        base = pick_base_port(nodes, first_port)
        yield kafka_local.up(nodes=nodes, base_dir=home, base_port=base)
    finally:
        try:
            kafka_local.down(home)
        finally:
            if not saved_jars:
                os.environ.pop(kafka_local.JARS_ENV, None)
