"""A starting node is not taken for dead while its launcher execs the JVM.

A new node's launcher formats its data dir, then execs the broker; for an instant inside that
exec the kernel shows the process with an empty command line. A readiness poll that read it
then raised "Kafka node 1 exited during startup" on a healthy node (CI, the three-node chaos
test). These tests script what /proc shows for a live process (this test's own pid).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra import broker_process
from infra.kafka_home import _MAIN_CLASS

_PROPS = Path("/data/node-1/server.properties")
_BROKER = [b"java", b"-Xmx512m", _MAIN_CLASS.encode(), str(_PROPS).encode(), b""]


def _script(monkeypatch: pytest.MonkeyPatch, reads: list[list[bytes]]) -> list[int]:
    """Serve ``reads`` in turn (the last one for ever); return the list that counts the reads."""
    calls: list[int] = []

    def read(pid: int) -> list[bytes]:
        calls.append(pid)
        return reads[min(len(calls), len(reads)) - 1]

    monkeypatch.setattr(broker_process, "_read_cmdline", read)
    return calls


def test_a_broker_read_mid_exec_is_still_our_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _script(monkeypatch, [[b""], [b""], _BROKER])
    assert broker_process.is_our_broker(os.getpid(), _PROPS)
    assert len(calls) == 3


def test_a_process_whose_command_line_stays_empty_is_not_a_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _script(monkeypatch, [[b""]])
    assert not broker_process.is_our_broker(os.getpid(), _PROPS, exec_wait_s=0.05)
    assert len(calls) > 1


def test_another_program_on_a_reused_pid_is_answered_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _script(monkeypatch, [[b"python3", b"-m", b"http.server", b""], _BROKER])
    assert not broker_process.is_our_broker(os.getpid(), _PROPS)
    assert len(calls) == 1


def test_another_nodes_broker_is_not_this_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    other = [b"java", _MAIN_CLASS.encode(), b"/data/node-2/server.properties", b""]
    _script(monkeypatch, [other])
    assert not broker_process.is_our_broker(os.getpid(), _PROPS)
