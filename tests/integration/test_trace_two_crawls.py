"""Two one-off crawls of one site on one data dir share its store: `crawlfleet trace` of a page
shows both crawls' visits, each its own fetched, parsed and stored steps, named by crawl
(issue 44, must-have 4). Before, the second crawl's visit replaced the first's (both were
visit 0 of one page) and trace showed one parse and one store. Each crawl, once finished,
leaves no topic or consumer group behind (before, its groups stayed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from core.config import Settings
from sites.scripted_site import ScriptedSite, page

pytestmark = pytest.mark.integration

HOST = "127.0.0.8"
WAIT_S = 120


def _cli(s: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """As a user's shell runs it: the broker and the data dir, no prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env.update(CRAWLFLEET_BOOTSTRAP_SERVERS=s.bootstrap_servers,
               CRAWLFLEET_DATA_DIR=str(s.data_dir))
    return subprocess.run([sys.executable, "-m", "crawlfleet.cli", *args], env=env,
                          capture_output=True, text=True, timeout=WAIT_S, check=False)


def _crawl(s: Settings, seeds: Path, summary: Path) -> str:
    out = _cli(s, "crawl", str(seeds), "--allow-private", "--summary-json", str(summary))
    assert out.returncode == 0, out.stdout + out.stderr
    prefix = str(json.loads(summary.read_text())["topic_prefix"])
    # A finished crawl leaves nothing on the broker: no topic, and no consumer group (its
    # static members, which never leave on close, removed first).
    admin = AdminClient(s.kafka_common())
    groups = [g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid]
    assert not [g for g in groups if g.startswith(prefix)], groups
    assert not [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    return prefix


def test_trace_shows_each_crawls_visit_of_a_page_crawled_twice(
        settings: Settings, site_port: int, tmp_path: Path) -> None:
    with ScriptedSite(HOST, site_port) as site:
        index, leaf = site.url("/index.html"), site.url("/leaf.html")
        site.set("/leaf.html", page())
        seeds = tmp_path / "seeds.txt"
        seeds.write_text(index + "\n")
        site.set("/index.html", page(leaf, title="first"))
        first = _crawl(settings, seeds, tmp_path / "first.json")
        site.set("/index.html", page(leaf, title="second"))
        second = _crawl(settings, seeds, tmp_path / "second.json")
        fetches = site.count("/index.html")
    assert first != second and fetches == 2

    out = _cli(settings, "trace", index, "--format", "tsv")
    assert out.returncode == 0, out.stderr
    head, *rows = [ln.split("\t") for ln in out.stdout.splitlines()]
    events = [dict(zip(head, r, strict=True)) for r in rows]
    steps = [(e["crawl"], e["event"], e["visit"]) for e in events
             if e["event"] in ("fetched", "parsed", "stored")]
    # Each crawl: one visit (its visit 0), fetched, parsed and stored, in this order, the
    # first crawl's before the second's.
    assert steps == [(first, "fetched", "0"), (first, "parsed", "0"), (first, "stored", "0"),
                     (second, "fetched", "0"), (second, "parsed", "0"),
                     (second, "stored", "0")], out.stdout
    assert len([e for e in events if e["event"] == "fetched"]) == fetches
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    # Each crawl's seed was enqueued in its own crawl; `pages` holds the latest version.
    assert [e["crawl"] for e in events if e["event"] == "enqueued"] == [first, second]
    parsed = [e["detail"] for e in events if e["event"] == "parsed"]
    assert "'second'" in parsed[1] and "'first'" not in " ".join(parsed), parsed
    # --crawl NAME: that crawl's steps alone
    only = _cli(settings, "trace", index, "--format", "tsv", "--crawl", first.rstrip("."))
    assert only.returncode == 0, only.stderr
    assert [ln.split("\t") for ln in only.stdout.splitlines()[1:]] == \
        [r for r in rows if r[head.index("crawl")] == first]
