"""Crawls never share a namespace by accident (issue 17, must-have 6), on the real broker.

Two users of one broker start one-off crawls of two different sites in the same clock second;
each must store exactly its own site and leave the other's topics alone. Two crawls given one
data dir: the second is refused, naming the first and the fix.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from core.config import Settings
from core.errors import InfraError
from infra.topics import NamespaceTakenError, create_topics, delete_topics, topology_of
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite
from sites.site_spec import SiteSpec

pytestmark = pytest.mark.integration

HOSTS_A = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
HOSTS_B = ("127.0.0.5", "127.0.0.6", "127.0.0.7")
CRAWL_TIMEOUT_S = 150

# Imports everything a crawl needs, says so, waits for the common release, notes the second
# it was released in, then runs `crawlfleet ARGS...` as the console script does.
_LAUNCH = """
import sys, time
from pathlib import Path
import crawlfleet.crawl
from crawlfleet.cli import app
ready, go, released = (Path(a) for a in sys.argv[1:4])
ready.write_text("ready")
while not go.exists():
    time.sleep(0.001)
released.write_text(repr(time.time()))
sys.argv = ["crawlfleet", *sys.argv[4:]]
app()
"""


def _env(s: Settings) -> dict[str, str]:
    """The environment of a user's shell: no crawlfleet settings but the broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env["CRAWLFLEET_BOOTSTRAP_SERVERS"] = s.bootstrap_servers
    return env


def _topics(s: Settings) -> set[str]:
    return set(AdminClient(s.kafka_common()).list_topics(timeout=10).topics)


def _own(s: Settings, prefix: str) -> set[str]:
    return {t.name for t in topology_of(s.replace(topic_prefix=prefix)).specs()}


def _stored(s: Settings, data_dir: Path) -> dict[str, int]:
    """url -> status in the store under ``data_dir``, read as a user reads it (its own
    process: chDB opens one store path per process)."""
    proc = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "sql", "--data-dir",
                           str(data_dir), "--format", "tsv",
                           "SELECT url, status FROM pages FINAL ORDER BY url"],
                          env=_env(s), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = [ln.split("\t") for ln in proc.stdout.splitlines()[1:] if ln]
    urls = [u for u, _ in rows]
    assert len(urls) == len(set(urls)), "FINAL left a page twice"
    return {u: int(st) for u, st in rows}


def _per_target(urls: collections.abc.Iterable[str]) -> dict[str, int]:
    return dict(collections.Counter(urlsplit(u).hostname or "" for u in urls))


class _Crawl:
    """One `crawlfleet crawl` in its own process and data dir, held at a start barrier."""

    def __init__(self, name: str, s: Settings, spec: SiteSpec, work: Path,
                 *extra: str) -> None:
        self.name = name
        self.data_dir = work / f"data-{name}"
        self.ready, self.released = work / f"{name}.ready", work / f"{name}.released"
        self.summary = work / f"{name}.summary.json"
        seeds = work / f"{name}.seeds"
        seeds.write_text("\n".join(spec.seeds()) + "\n")
        self.out = (work / f"{name}.out").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(self.ready), str(work / "go"),
             str(self.released), "crawl", str(seeds), "--data-dir", str(self.data_dir),
             "--allow-private", "--timeout", str(CRAWL_TIMEOUT_S),
             "--summary-json", str(self.summary), *extra],
            env=_env(s), stdout=self.out, stderr=subprocess.STDOUT, text=True)

    def prefix(self) -> str | None:
        """The crawl's topic prefix, once its fleet started (its topics are being made)."""
        logs = self.data_dir / "logs"
        found = [p.name for p in logs.iterdir()] if logs.is_dir() else []
        return f"{found[0]}." if found else None

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def stop(self) -> None:
        """Interrupt a crawl still running (a failed test): it stops its own fleet."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()


@contextlib.contextmanager
def _crawls(s: Settings, *crawls: _Crawl) -> Iterator[None]:
    """Stop crawls a failed test left running, and remove what they left on the broker."""
    try:
        yield
    finally:
        for c in crawls:
            prefix = c.prefix()
            c.stop()
            if prefix:
                with contextlib.suppress(InfraError):
                    delete_topics(s.replace(topic_prefix=prefix), timeout_s=10)


def _release_together(work: Path, crawls: tuple[_Crawl, ...]) -> None:
    """Open the barrier just after a second begins, once every crawl waits at it."""
    deadline = time.monotonic() + 120
    while not all(c.ready.exists() for c in crawls):
        for c in crawls:
            assert c.proc.poll() is None, f"crawl {c.name} died before the barrier:\n" \
                + c.output()
        assert time.monotonic() < deadline, "crawls never reached the barrier"
        time.sleep(0.05)
    now = time.time()
    time.sleep(math.floor(now) + 1.02 - now)
    (work / "go").touch()


def test_two_crawls_started_in_the_same_second_each_store_only_their_own_site(
        settings: Settings, site_port: int, tmp_path: Path) -> None:
    """Before, both were named ``c<second>.``: they fenced each other, stored each other's
    pages, and the first to finish deleted the other's topics."""
    spec_a, spec_b = demo_spec(site_port, HOSTS_A), demo_spec(site_port, HOSTS_B)
    # A polls its site faster so it finishes while B still runs: the moment A deletes its
    # topics is the moment B's could go with them.
    with DemoSite(spec_a), DemoSite(spec_b):
        a = _Crawl("a", settings, spec_a, tmp_path, "--rate-cap", "6")
        b = _Crawl("b", settings, spec_b, tmp_path)
        with _crawls(settings, a, b):
            _release_together(tmp_path, (a, b))
            seen_both = finished_first = False
            deadline = time.monotonic() + CRAWL_TIMEOUT_S + 60
            while b.proc.poll() is None or a.proc.poll() is None:
                assert time.monotonic() < deadline, "the crawls did not finish"
                pa, pb = a.prefix(), b.prefix()
                if not seen_both and pa and pb and a.proc.poll() is None \
                        and b.proc.poll() is None:
                    # A crawl's fleet starts while its topics are made: both sets are
                    # awaited (a crawl ending before both exist fails below).
                    seen_both = _own(settings, pa) | _own(settings, pb) <= _topics(settings)
                for c in (a, b):
                    if c.proc.poll() is not None and not seen_both:
                        pytest.fail(f"crawl {c.name} ended (exit {c.proc.returncode}) before "
                                    f"both ran:\n{c.output()}")
                if not finished_first and a.proc.poll() is not None:
                    finished_first = True
                    assert b.proc.poll() is None, "B should still run when A has finished"
                    assert pa and pb
                    live = _topics(settings)
                    assert not _own(settings, pa) & live, "A removed its own topics"
                    assert _own(settings, pb) <= live, "A left B's topics alone"
                time.sleep(0.1)
            out_a, out_b = a.output(), b.output()

    assert a.proc.returncode == 0, out_a
    assert b.proc.returncode == 0, out_b
    # Released in one second, and named in it: only the random part keeps them apart.
    assert int(float(a.released.read_text())) == int(float(b.released.read_text()))
    sum_a, sum_b = json.loads(a.summary.read_text()), json.loads(b.summary.read_text())
    pre_a, pre_b = sum_a["topic_prefix"], sum_b["topic_prefix"]
    assert pre_a != pre_b
    assert re.fullmatch(r"c\d+-[0-9a-f]{6}\.", pre_a) and re.fullmatch(r"c\d+-[0-9a-f]{6}\.",
                                                                      pre_b)
    assert pre_a.split("-")[0] == pre_b.split("-")[0], "the same start second"
    assert (pre_a, pre_b) == (f"{a.prefix()}", f"{b.prefix()}")

    # Each store holds exactly its own site, target by target, and nothing of the other's.
    stored_a, stored_b = _stored(settings, a.data_dir), _stored(settings, b.data_dir)
    assert _per_target(stored_a) == _per_target(spec_a.expected())
    assert _per_target(stored_b) == _per_target(spec_b.expected())
    assert stored_a == spec_a.expected()
    assert stored_b == spec_b.expected()
    assert sum_a["drained"] and sum_b["drained"]
    # Each removed every topic it had created and nothing else, B's while B still ran.
    assert seen_both and finished_first, "A finished first"
    assert sum_a["topics_deleted"] == len(_own(settings, pre_a))
    assert sum_b["topics_deleted"] == len(_own(settings, pre_b))
    assert not [t for t in _topics(settings) if t.startswith((pre_a, pre_b))]


def test_a_second_crawl_on_the_same_data_dir_is_refused_naming_the_first(
        settings: Settings, site_port: int, tmp_path: Path) -> None:
    spec = demo_spec(site_port, HOSTS_A)
    with DemoSite(spec):
        first = _Crawl("first", settings, spec, tmp_path)
        with _crawls(settings, first):
            (tmp_path / "go").touch()
            deadline = time.monotonic() + 120
            while first.prefix() is None:  # its fleet, the store worker with it, started
                assert first.proc.poll() is None, first.output()
                assert time.monotonic() < deadline, "the first crawl never started its fleet"
                time.sleep(0.05)
            seeds = tmp_path / "second.seeds"
            seeds.write_text("\n".join(spec.seeds()) + "\n")
            second = subprocess.run(
                [sys.executable, "-m", "crawlfleet.cli", "crawl", str(seeds), "--data-dir",
                 str(first.data_dir), "--allow-private", "--timeout", "30"],
                env=_env(settings), capture_output=True, text=True, timeout=120, check=False)
            first_ran_on = first.proc.poll() is None
            first.proc.wait(CRAWL_TIMEOUT_S + 60)
            out_first = first.output()

    assert second.returncode == 2, second.stdout + second.stderr
    assert first_ran_on, "the refusal came while the first crawl ran"
    err = " ".join(second.stderr.split())
    assert f"another crawl (pid {first.proc.pid}" in err, err
    assert "--data-dir" in err, err
    assert "Traceback" not in second.stderr and "Cannot lock" not in err, err  # not chDB's
    # Refused before it made anything: one crawl's logs, and the first crawl unharmed.
    assert len(list((first.data_dir / "logs").iterdir())) == 1
    assert first.proc.returncode == 0, out_first
    assert _stored(settings, first.data_dir) == spec.expected()


def test_a_fresh_namespace_refuses_any_topic_or_group_of_its_prefix(settings: Settings) -> None:
    """What a one-off crawl finds under its prefix is someone else's: never adopt it."""
    own = _own(settings, settings.topic_prefix)
    create_topics(settings)  # another crawl's topics, under this prefix
    with pytest.raises(NamespaceTakenError, match=re.escape(
            f"--topic-prefix {settings.topic_prefix}")):
        create_topics(settings, fresh=True)
    assert own <= _topics(settings)  # refused without deleting the owner's topics
    assert set(create_topics(settings).values()) == {"exists"}  # a resume still adopts
    delete_topics(settings)

    # Only a group left behind (committed offsets, its topics gone) still names an owner.
    group = topology_of(settings).group("fetch")
    consumer = Consumer({**settings.kafka_common(), "group.id": group,
                         "enable.auto.commit": False})
    try:
        create_topics(settings)
        consumer.commit(offsets=[TopicPartition(topology_of(settings).frontier, 0, 0)],
                        asynchronous=False)
    finally:
        consumer.close()
    delete_topics(settings, stages=())  # topics gone, the group stays
    assert not own & _topics(settings)
    with pytest.raises(NamespaceTakenError, match=re.escape(f"group {group}")):
        create_topics(settings, fresh=True)
    assert not own & _topics(settings)  # nothing created
    delete_topics(settings, topics=())  # the group
    assert set(create_topics(settings, fresh=True).values()) == {"created"}
    # A crawl deletes the topics it names (the ones it created), nothing else of the prefix.
    frontier = topology_of(settings).frontier
    assert delete_topics(settings, topics=[frontier], stages=()) == [frontier]
    assert _topics(settings) & own == own - {frontier}


def test_racing_fresh_namespaces_never_both_own_one_prefix(settings: Settings) -> None:
    """Two creators that both found the prefix free: the broker's "already exists" decides,
    and a loser deletes only what it created itself."""
    own = _own(settings, settings.topic_prefix)
    barrier = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def create(name: str) -> None:
        barrier.wait()
        try:
            outcome[name] = create_topics(settings, fresh=True)
        except NamespaceTakenError as exc:
            outcome[name] = exc
        except InfraError as exc:  # pragma: no cover - reported below
            outcome[name] = f"unexpected: {exc}"

    threads = [threading.Thread(target=create, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    won = [r for r in outcome.values() if isinstance(r, dict)]
    lost = [r for r in outcome.values() if isinstance(r, NamespaceTakenError)]
    assert len(won) + len(lost) == 2, outcome
    assert len(won) <= 1, "two creators both own one namespace"
    if won:
        assert set(won[0].values()) == {"created"}
        assert own <= _topics(settings), "the loser deleted none of the winner's topics"
    else:  # both lost a share of the topics: each deleted its own, nothing is left half-made
        assert not own & _topics(settings)
