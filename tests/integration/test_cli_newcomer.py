"""The CLI as a newcomer meets it: run as a subprocess with its output piped, as CI and
scripts run it, against the real broker and a real chDB store."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from core.config import Settings
from infra.clickhouse import Store
from infra.topics import create_topics
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite

pytestmark = pytest.mark.integration


def _env(s: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env.update(CRAWLFLEET_BOOTSTRAP_SERVERS=s.bootstrap_servers,
               CRAWLFLEET_DATA_DIR=str(s.data_dir), **extra)
    return env


def _cli(env: dict[str, str], *args: str, stdin: str | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crawlfleet.cli", *args], env=env,
                          input=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def store(settings: Settings) -> Settings:
    st = Store(settings)
    st.ensure_schema()
    st.close()
    return settings


def test_a_misspelt_table_prints_the_engines_line_and_the_views(store: Settings) -> None:
    proc = _cli(_env(store), "sql", "SELECT * FROM pagez")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert "pagez" in lines[0] and "UNKNOWN_TABLE" in lines[0]
    assert lines[1].startswith("tables and views:")
    for name in ("pages_v", "fetch_events_v", "dead_letters_v"):
        assert name in lines[1]


def test_piped_sql_tables_are_not_cut_to_the_terminal_width(store: Settings) -> None:
    proc = _cli(_env(store), "sql", "SELECT repeat('x', 300) AS wide, 'end' AS last")
    assert proc.returncode == 0, proc.stderr
    assert "x" * 300 in proc.stdout and "end" in proc.stdout


def test_a_misspelt_variable_and_a_bad_value_are_named(store: Settings) -> None:
    typo = _cli(_env(store, CRAWLFLEET_RATE_CAPP="2"), "sql", "SELECT 1")
    assert typo.returncode == 2
    assert "CRAWLFLEET_RATE_CAPP (did you mean CRAWLFLEET_RATE_CAP?)" in typo.stderr
    bad = _cli(_env(store, CRAWLFLEET_RATE_CAP="fast"), "sql", "SELECT 1")
    assert bad.returncode == 2
    assert "CRAWLFLEET_RATE_CAP='fast'" in bad.stderr and "expected a number" in bad.stderr


def test_publish_exits_non_zero_when_lines_were_rejected(settings: Settings) -> None:
    create_topics(settings)
    env = _env(settings, CRAWLFLEET_TOPIC_PREFIX=settings.topic_prefix)
    some_bad = _cli(env, "publish", "-", stdin="http://127.0.0.2:18099/a\nnot a url\n")
    assert some_bad.returncode == 3, some_bad.stderr
    assert "published 1" in some_bad.stdout and "bad lines 1" in some_bad.stdout
    all_bad = _cli(env, "publish", "-", stdin="nope\n")
    assert all_bad.returncode == 1
    good = _cli(env, "publish", "-", stdin="http://127.0.0.2:18099/b\n")
    assert good.returncode == 0, good.stderr


def test_a_piped_crawl_that_times_out_prints_plain_lines_and_removes_its_topics(
        settings: Settings, site_port: int, tmp_path: Path) -> None:
    spec = demo_spec(site_port)
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("\n".join(spec.seeds()) + "\n")
    with DemoSite(spec):
        proc = _cli(_env(settings, CRAWLFLEET_RATE_CAP="0.5"), "crawl", str(seeds),
                    "--allow-private", "--timeout", "4", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # not drained
    progress = [ln for ln in proc.stderr.splitlines() if re.match(r"\s*\d+s\s+fetched", ln)]
    assert progress, proc.stderr  # one plain line per interval, not a redrawn table
    assert "timed out: this run's topics" in proc.stderr
    out = proc.stdout.splitlines()
    assert any("crawl summary" in ln for ln in out)
    assert any(ln.strip().startswith("drained") or "no (timed out)" in ln for ln in out)
    prefix = re.search(r"\b(c\d+-[0-9a-f]{6}\.)", proc.stdout)
    assert prefix, proc.stdout
    topics = AdminClient(settings.kafka_common()).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(prefix.group(1))]


def test_the_escape_hatch_and_dead_letter_commands_as_an_operator_runs_them(
        settings: Settings, store: Settings) -> None:
    """RUNBOOK's commands, as typed: pause/cap/resume reach crawl.control; dlq list/show
    read the store; dlq replay --dry-run plans without publishing."""
    import json
    from datetime import UTC, datetime

    from infra.clickhouse import DEAD_COLUMNS
    from infra.topics import topology_of
    from schemas.codec import default_codec
    from streams.control import ControlReader

    create_topics(settings)
    env = _env(settings, CRAWLFLEET_TOPIC_PREFIX=settings.topic_prefix)
    for args in (["pause", "--target", "a.test"], ["cap", "b.test", "0.5"], ["pause"]):
        proc = _cli(env, *args)
        assert proc.returncode == 0, proc.stderr
    reader = ControlReader(settings, topology_of(settings).control, default_codec())
    try:
        assert reader.catch_up(30)
        assert reader.state.paused and "a.test" in reader.state.paused_targets
        assert reader.state.caps == {"b.test": 0.5}
        assert _cli(env, "resume").returncode == 0
        assert reader.catch_up(30) and not reader.state.paused
    finally:
        reader.close()

    job = {"url": "http://127.0.0.2:18099/gone", "profile": "default", "target": "127.0.0.2",
           "depth": 0, "attempt": 3, "priority": 0, "parent_url": None, "last_error": "http_503",
           "delay_ms": 0, "meta": {}}
    st = Store(store)
    st.insert("dead_letters", DEAD_COLUMNS, [(
        f"{settings.topic_prefix}crawl.dead:0:7", datetime.now(UTC), job["url"], "127.0.0.2",
        "default", f"{settings.topic_prefix}crawl.frontier", "http_503", "HTTP 503 from x", 3,
        "fetch-0", "0.1.0", "00", json.dumps(job))], "t1")
    barred = {**job, "url": "http://127.0.0.2:18099/private/x", "last_error": None}
    st.insert("dead_letters", DEAD_COLUMNS, [(
        f"{settings.topic_prefix}crawl.dead:0:8", datetime.now(UTC), barred["url"],
        "127.0.0.2", "default", f"{settings.topic_prefix}crawl.frontier", "robots_disallowed",
        "robots.txt disallows it", 1, "fetch-0", "0.1.0", "00", json.dumps(barred))], "t2")
    st.close()
    listed = _cli(env, "dlq", "list", "--reason", "http_503", "--since", "1h")
    assert listed.returncode == 0, listed.stderr
    assert "crawl.dead:0:7" in listed.stdout and "gone" in listed.stdout
    # One time format everywhere (trace prints the same): UTC, milliseconds, "Z".
    assert re.search(r"T\d{2}:\d{2}:\d{2}\.\d{3}Z", listed.stdout), listed.stdout
    assert "+00:00" not in listed.stdout
    shown = _cli(env, "dlq", "show", f"{settings.topic_prefix}crawl.dead:0:7")
    assert shown.returncode == 0, shown.stderr
    assert "HTTP 503 from x" in shown.stdout
    dry = _cli(env, "dlq", "replay", "--reason", "http_503", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would replay" in dry.stdout and "1 to replay" in dry.stdout
    unfiltered = _cli(env, "dlq", "replay", "--dry-run")
    assert unfiltered.returncode == 2 and "--all" in unfiltered.stderr
    every = _cli(env, "dlq", "replay", "--all", "--dry-run")
    assert every.returncode == 0, every.stderr
    assert "1 to replay" in every.stdout and "private/x" not in every.stdout  # can't succeed
    named = _cli(env, "dlq", "replay", "--reason", "robots_disallowed", "--dry-run")
    assert "1 to replay" in named.stdout and "private/x" in named.stdout


def test_publish_before_topics_create_says_so_at_once_with_the_bad_lines(
        settings: Settings) -> None:
    env = _env(settings, CRAWLFLEET_TOPIC_PREFIX=settings.topic_prefix)
    began = time.monotonic()
    proc = _cli(env, "publish", "-", stdin="http://127.0.0.2:18099/a\nnot a url\n")
    took = time.monotonic() - began
    print(f"publish before topics create: exit {proc.returncode} after {took:.1f} s")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{settings.topic_prefix}crawl.frontier" in proc.stderr
    assert "does not exist" in proc.stderr or "do not exist" in proc.stderr
    assert "crawlfleet topics create" in proc.stderr
    assert "line 2:" in proc.stderr  # the bad-line report, all the same
    assert "TERMINATE" not in proc.stderr and "undelivered" not in proc.stderr
    assert took < 25, took  # it used to wait out a 30-s flush first
    topics = AdminClient(settings.kafka_common()).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(settings.topic_prefix)]  # none made


def test_an_unreachable_broker_is_one_clear_line_for_every_one_shot_command(
        settings: Settings) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        where = f"127.0.0.1:{sock.getsockname()[1]}"
    env = {**_env(settings), "CRAWLFLEET_BOOTSTRAP_SERVERS": where}
    commands = (["top", "--once"], ["publish", "-"], ["pause"], ["topics", "create"],
                ["doctor"])
    began = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "crawlfleet.cli", *args], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args in commands]
    outs = [p.communicate(timeout=120) for p in procs]
    took = time.monotonic() - began
    print(f"{len(commands)} commands against {where} (in parallel): {took:.1f} s")
    for args, proc, (out, err) in zip(commands, procs, outs, strict=True):
        shown = out + err
        assert proc.returncode != 0, (args, shown)
        assert f"cannot reach Kafka at {where}" in shown, (args, shown)
        assert "crawlfleet kafka up" in shown, (args, shown)
        assert not re.search(r"^%\d\|", shown, re.M), (args, shown)  # no librdkafka lines
        assert "fleet running" not in shown
    assert took < 30, took  # each gives up after 8 s; it used to take up to a minute


def test_top_on_an_idle_broker_says_no_workers(settings: Settings) -> None:
    create_topics(settings)
    proc = _cli(_env(settings, CRAWLFLEET_TOPIC_PREFIX=settings.topic_prefix), "top", "--once")
    assert proc.returncode == 0, proc.stderr
    assert "fleet no workers" in proc.stdout, proc.stdout
    assert "fleet running" not in proc.stdout
    # The quarantine app is listed like a stage (no process: lag only); none in force.
    assert "active quarantines: none" in proc.stdout, proc.stdout
    assert not re.search(r"│\s*0:", proc.stdout), proc.stdout


def test_the_dashboards_after_a_drained_crawl_read_as_drained(
        settings: Settings, site_port: int, tmp_path: Path) -> None:
    """README's first steps, as typed: a crawl that drains, then the two dashboards a new
    user looks at first. Queue depth ends at 0 and throughput shows the fetching."""
    import json

    spec = demo_spec(site_port)
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("\n".join(spec.seeds()) + "\n")
    env = _env(settings)
    with DemoSite(spec):
        crawl = _cli(env, "crawl", str(seeds), "--allow-private", timeout=300)
    assert crawl.returncode == 0, crawl.stdout + crawl.stderr
    depth = _cli(env, "sql", "--view", "queue_depth", "--format", "json")
    assert depth.returncode == 0, depth.stderr
    last: dict[str, int] = {}
    for row in json.loads(depth.stdout):  # ordered by time
        last[row["stage"]] = int(row["lag"])
    assert last == {"fetch": 0, "parse": 0, "store": 0, "retry": 0, "revisit": 0}, depth.stdout
    rates = _cli(env, "sql", "--view", "throughput", "--format", "json")
    fetch = [float(r["records_per_s"]) for r in json.loads(rates.stdout) if r["stage"] == "fetch"]
    assert fetch and max(fetch) > 0, rates.stdout
