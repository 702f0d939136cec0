"""Who may open the embedded store: the owner and open locks (flocks held by other real
processes; chDB itself is never opened here -- every refusal comes before it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.config import Settings, load_settings
from infra.clickhouse import OPEN_LOCK, PORT_FILE, PathLock, Store, StoreHeldError, StoreOwnership
from infra.store_query import run_query

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    s = load_settings(data_dir=tmp_path / "data")
    s.clickhouse_path.mkdir(parents=True)
    return s


def hold(settings: Settings, what: str) -> subprocess.Popen[str]:
    """A process that takes ``what`` ("owner": the store worker's claim, "open": a reader's
    open lock) and holds it until killed."""
    take = ("StoreOwnership(s).claim()" if what == "owner"
            else "PathLock(s.clickhouse_path / OPEN_LOCK).acquire('reader')")
    code = textwrap.dedent(f"""
        import sys, time
        from core.config import load_settings
        from infra.clickhouse import OPEN_LOCK, PathLock, StoreOwnership
        s = load_settings(data_dir=sys.argv[1])
        assert {take}
        print("held", flush=True)
        time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", code, str(settings.data_dir)], env=env,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        p.kill()
        p.wait(10)


def test_a_stale_port_file_never_makes_a_reader_open_the_store_of_a_live_owner(
        settings: Settings, procs: list[subprocess.Popen[str]]) -> None:
    owner = hold(settings, "owner")
    procs.append(owner)
    # A port file nobody answers on, as a killed worker leaves it (and as the new owner has
    # not replaced yet while it opens the store).
    (settings.clickhouse_path / PORT_FILE).write_text("1")
    said: list[str] = []
    with pytest.raises(StoreHeldError) as caught:
        run_query(settings, "SELECT 1", wait_s=1.0, on_wait=said.append)
    assert caught.value.by_owner
    assert f"store worker pid {owner.pid}" in str(caught.value)
    assert "did not serve queries within 1 s" in str(caught.value)
    assert len(said) == 1 and "waiting up to 1 s for it to serve queries" in said[0]
    assert not (settings.clickhouse_path / "status").exists()  # chDB never opened


def test_a_store_worker_finds_a_reader_holding_the_store(
        settings: Settings, procs: list[subprocess.Popen[str]]) -> None:
    reader = hold(settings, "open")
    procs.append(reader)
    ownership = StoreOwnership(settings)
    assert ownership.claim()  # no store worker: the claim is ours at once
    with pytest.raises(StoreHeldError) as caught:
        Store(settings, owner=True)
    assert not caught.value.by_owner
    assert caught.value.holder is not None and caught.value.holder.pid == reader.pid
    assert caught.value.holder.role == "reader"
    ownership.release()


def test_a_second_store_worker_waits_for_the_first(
        settings: Settings, procs: list[subprocess.Popen[str]]) -> None:
    first = hold(settings, "owner")
    procs.append(first)
    second = StoreOwnership(settings)
    assert not second.claim()
    holder = second.holder()
    assert holder is not None and holder.pid == first.pid and holder.role == "store worker"
    first.send_signal(signal.SIGKILL)  # a dying predecessor lets go as it exits
    first.wait(10)
    (settings.clickhouse_path / PORT_FILE).write_text("1")
    assert second.claim()
    assert not (settings.clickhouse_path / PORT_FILE).exists()  # the dead owner's, removed
    second.release()


def test_testing_a_lock_never_takes_it(settings: Settings,
                                       procs: list[subprocess.Popen[str]]) -> None:
    lock = PathLock(settings.clickhouse_path / OPEN_LOCK)
    assert not lock.held()
    reader = hold(settings, "open")
    procs.append(reader)
    assert lock.held() and lock.held()  # asked twice: still the reader's
    assert not lock.acquire("reader")
    reader.kill()
    reader.wait(10)
    assert not lock.held()
    assert lock.acquire("reader") and lock.held_here
    lock.release()
