"""A one-off crawl's own namespace and its hold on the data dir (no broker needed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.config import Secret, Settings
from crawlfleet import crawl
from crawlfleet.crawl import CRAWL_LOCK, DataDirBusyError, hold_data_dir, one_off_prefix

FROZEN = 1796150310.25


def test_crawls_started_in_one_second_get_distinct_valid_prefixes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock's second alone named the namespace: two crawls in one second shared it."""
    monkeypatch.setattr(crawl.time, "time", lambda: FROZEN)
    # 100, not more: the tag is 24 random bits, so 500 draws collided once in ~130 runs
    # (birthday bound), while two real crawls in one second collide once in 16 million.
    prefixes = [one_off_prefix() for _ in range(100)]
    assert len(set(prefixes)) == len(prefixes)
    for p in prefixes:
        assert re.fullmatch(r"c1796150310-[0-9a-f]{6}\.", p), p  # readable: time, then tag
        assert Settings(topic_prefix=p).topic_prefix == p  # passes the prefix validation


_HOLDER = """
import sys, time
from pathlib import Path
from core.config import Settings
from crawlfleet.crawl import hold_data_dir
with hold_data_dir(Settings(data_dir=Path(sys.argv[1]), topic_prefix="c1-abcdef.")):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(data_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(data_dir)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_crawl_on_a_held_data_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = _holder(data)
    try:
        with pytest.raises(DataDirBusyError) as refused, hold_data_dir(Settings(data_dir=data)):
            pytest.fail("the data dir is held by another crawl")
        msg = str(refused.value)
        assert f"pid {holder.pid}" in msg and "topics c1-abcdef.*" in msg, msg
        assert "--data-dir" in msg and str(data) in msg, msg
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: the kernel lets go
        holder.wait(10)
    with hold_data_dir(Settings(data_dir=data, topic_prefix="c2-000000.")):
        assert f'"pid": {os.getpid()}' in (data / CRAWL_LOCK).read_text()
        # Held in this process too: a second open of the file is another lock.
        with pytest.raises(DataDirBusyError, match=f"pid {os.getpid()}"), \
                hold_data_dir(Settings(data_dir=data)):
            pass
    with hold_data_dir(Settings(data_dir=data)):  # released on leaving
        pass


def test_a_clickhouse_server_store_leaves_the_data_dir_shared(tmp_path: Path) -> None:
    """Only the embedded store is one-process-per-path; a server's crawls share nothing here."""
    s = Settings(data_dir=tmp_path / "data",
                 clickhouse_dsn=Secret("http://default@127.0.0.1:8123/default"))
    with hold_data_dir(s), hold_data_dir(s):
        assert not (s.data_dir / CRAWL_LOCK).exists()
