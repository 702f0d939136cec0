"""The crawl you mean, on the real broker (issue 44): operator commands find the crawl running
on the data dir, say at once when a namespace has no topics, and a crawl stopped by SIGTERM
ends with an interrupted summary, its resume command, and topics that `crawls` lists and
`crawls rm` removes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from fleet_helpers import OutputLines

from core.config import Settings
from infra.clickhouse import Store
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite

pytestmark = pytest.mark.integration
WAIT_S = 120


def _env(s: Settings, **extra: str) -> dict[str, str]:
    """A user's shell: the broker and the data dir, no prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env.update(CRAWLFLEET_BOOTSTRAP_SERVERS=s.bootstrap_servers,
               CRAWLFLEET_DATA_DIR=str(s.data_dir), **extra)
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crawlfleet.cli", *args], env=env,
                          capture_output=True, text=True, timeout=WAIT_S, check=False)


def _topics(s: Settings) -> set[str]:
    return set(AdminClient(s.kafka_common()).list_topics(timeout=10).topics)


def test_a_command_on_a_namespace_without_topics_says_so_naming_the_fix(
        settings: Settings) -> None:
    """Before: `pause` waited 30 s and said "control records [...] were not delivered"."""
    env = _env(settings)
    out = _cli(env, "pause")
    assert out.returncode == 2
    assert "shared namespace (no --topic-prefix) has no topics" in out.stderr, out.stderr
    assert "crawlfleet topics create" in out.stderr
    cap = _cli(env, "cap", "example.com", "1", "--topic-prefix", "nosuch-crawl")
    assert cap.returncode == 2 and "crawl nosuch-crawl. has no topics" in cap.stderr, cap.stderr


def test_an_empty_result_says_0_rows(settings: Settings) -> None:
    """Before: one blank line."""
    store = Store(settings)
    store.ensure_schema()
    store.close()
    out = _cli(_env(settings), "sql", "SELECT 1 AS one WHERE 0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("0 rows")



def test_pause_finds_the_running_crawl_and_sigterm_ends_it_resumable(
        settings: Settings, site_port: int, tmp_path: Path) -> None:
    spec = demo_spec(site_port)
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("\n".join(spec.seeds()) + "\n")
    env = _env(settings, CRAWLFLEET_RATE_CAP="1")
    with DemoSite(spec):
        crawl = subprocess.Popen(
            [sys.executable, "-m", "crawlfleet.cli", "crawl", str(seeds), "--allow-private"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            err = OutputLines(crawl.stderr)
            prefix = err.until(r"^crawl (\S+) started")[1]
            resume = err.until(r"resume it with: (.*)$")[1].strip()
            assert f"--topic-prefix {prefix}" in resume and "--allow-private" in resume
            err.until(r"fetched [1-9]")
            # no --topic-prefix: the crawl running on the data dir is the one paused
            paused = _cli(env, "pause")
            assert paused.returncode == 0, paused.stderr
            assert f"crawl {prefix}" in paused.stdout
            err.until(r"\| paused")
            listed = _cli(env, "crawls")
            assert re.search(rf"{re.escape(prefix)}.*running", listed.stdout), listed.stdout
            crawl.send_signal(signal.SIGTERM)
            out, _ = crawl.communicate(timeout=WAIT_S)
        finally:
            if crawl.poll() is None:
                crawl.kill()
    rest = "".join(err.seen)
    assert crawl.returncode == 128 + signal.SIGTERM, out + rest
    assert "no (interrupted)" in out and "shared by every crawl of the data dir" in out, out
    assert re.search(r"paused\s+.*yes", out), out
    assert any(t.startswith(prefix) for t in _topics(settings))  # kept, to resume
    listed = _cli(env, "crawls")
    assert re.search(rf"{re.escape(prefix)}.*interrupted", listed.stdout), listed.stdout
    removed = _cli(env, "crawls", "rm", prefix.rstrip("."))
    assert removed.returncode == 0 and f"removed crawl {prefix}" in removed.stdout, \
        removed.stderr
    assert not any(t.startswith(prefix) for t in _topics(settings))
    assert prefix not in _cli(env, "crawls").stdout


def test_a_crawl_whose_every_seed_is_refused_exits_nothing_fetched(
        settings: Settings, site_port: int, tmp_path: Path) -> None:
    """Before: exit 0. A loopback seed without --allow-private is refused by address."""
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(f"http://127.0.0.2:{site_port}/\n")
    out = _cli(_env(settings), "crawl", str(seeds))
    assert out.returncode == 4, out.stdout + out.stderr
    assert "nothing could be fetched" in out.stderr


def test_a_command_in_another_folder_finds_the_users_broker(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Before: "no Kafka configured and no local broker running" (and a crawl tried to start
    a second broker on the taken port). The broker `kafka up` started is noted per user."""
    from infra.broker_note import note_broker, noted_bootstrap
    note_broker(Path(__file__).resolve().parents[2] / ".crawlfleet" / "test-kafka")
    assert noted_bootstrap() == kafka_bootstrap
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    elsewhere = tmp_path / "another-folder"
    elsewhere.mkdir()
    out = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "crawls"], cwd=elsewhere,
                         env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                         capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert out.returncode == 0, out.stderr
    assert "crawls" in out.stdout
