"""Helpers for fault tests: real worker processes, bounded waits, store and topic readers.

Every worker is a real ``python -m crawlfleet.cli worker STAGE --worker-id ID`` process with
its settings passed as ``CRAWLFLEET_*`` variables, exactly as :class:`crawlfleet.crawl.Fleet`
starts them, but individually controllable: stop, kill -9, freeze (SIGSTOP), thaw
(SIGCONT), restart with the same id, per-worker extra env (fault injection) and optional
boot code (a skewed wall clock). :class:`Workers` kills everything it started when closed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from core.config import Settings
from core.errors import CrawlfleetError
from crawlfleet.crawl import settings_env
from crawlfleet.fleet import ANALYTICS_STOP_S
from infra.clickhouse import PORT_FILE
from infra.lag import LagProbe
from infra.store_query import query_owner, run_query
from infra.topics import create_topics, topology_of
from producers.frontier import publish
from schemas.codec import default_codec
from schemas.stages import analytics_stages
from streams.status import holds_work, idle_for

T = TypeVar("T")


# --- waiting ---------------------------------------------------------------------------------


def wait_until(pred: Callable[[], T], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll ``pred`` until it returns something truthy (returned) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} "
                                 f"(last value: {last!r})")
        time.sleep(interval)


# --- worker processes ------------------------------------------------------------------------


class Worker:
    """One stage worker process (a fresh process per start; restarts keep the id)."""

    def __init__(self, settings: Settings, stage: str, wid: str, log_path: Path,
                 env: dict[str, str], prefix: list[str], boot: str | None = None) -> None:
        self.settings = settings
        self.stage = stage
        self.wid = wid
        self.log_path = log_path
        self.env = env
        self.prefix = prefix
        self.boot = boot
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra = {k: v for k, v in env.items()
                      if k in ("CRAWLFLEET_FAULT", "CRAWLFLEET_CLOCK_SKEW_S")}
        self.frozen = False
        self.starts = 0

    def start(self) -> Worker:
        assert self.proc is None or self.proc.poll() is not None, f"{self.wid} still running"
        with self.log_path.open("ab") as log:
            log.write(f"=== start #{self.starts + 1} of {self.wid} at {time.time():.3f} "
                      f"(extra env {self.extra})"
                      " ===\n".encode())
            log.flush()
            entry = ["-c", self.boot] if self.boot else ["-m", "crawlfleet.cli"]
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, *entry, "worker", self.stage,
                 "--worker-id", self.wid],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.starts += 1
        self.frozen = False
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def freeze(self) -> None:
        """SIGSTOP: the whole process (librdkafka heartbeats included) stops, as in a GC pause."""
        assert self.alive(), f"{self.wid} is not running"
        os.kill(self.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)
        self.frozen = False

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)
        self.frozen = False

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (after SIGCONT if frozen), then SIGKILL if it does not leave in time."""
        if not self.alive():
            return
        assert self.proc is not None
        if self.frozen:
            self.thaw()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{self.wid} did not exit within {timeout:.0f}s") from exc

    @property
    def status_path(self) -> Path:
        return self.settings.status_dir / f"{self.stage}-{self.wid}.json"

    def status(self) -> dict[str, Any]:
        """The worker's status JSON ({} if none yet or being replaced)."""
        try:
            data: dict[str, Any] = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}
        return data

    def counter(self, name: str) -> int:
        return int(self.status().get("counters", {}).get(name, 0))

    def assignment(self) -> set[tuple[str, int]]:
        """The partitions this worker's consumer holds, every topic, as it reports them."""
        return {(t, p) for t, p in self.status().get("assignment", [])}

    def gauge(self, name: str) -> int:
        return int(self.status().get("gauges", {}).get(name, 0))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


class Workers:
    """The worker processes of one test; :meth:`close` leaves none behind."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.log_dir = settings.data_dir / "logs" / (settings.topic_prefix.rstrip(".") or "x")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.base_env = {**os.environ, **settings_env(settings)}
        self.base_env.pop("CRAWLFLEET_CONFIG", None)
        self.base_env.pop("CRAWLFLEET_FAULT", None)
        self.all: dict[str, Worker] = {}

    def start(self, stage: str, wid: str | None = None, env: dict[str, str] | None = None,
              prefix: Iterable[str] = (), boot: str | None = None) -> Worker:
        """Start a worker; ``boot`` is Python run instead of ``-m crawlfleet.cli``."""
        wid = wid or f"{stage}-0"
        w = Worker(self.settings, stage, wid, self.log_dir / f"{wid}.log",
                   {**self.base_env, **(env or {})}, list(prefix), boot)
        self.all[wid] = w
        return w.start()

    def restart(self, wid: str, env: dict[str, str] | None = None) -> Worker:
        """Start ``wid`` again (same id: it fences its former self) with base env + ``env``."""
        old = self.all[wid]
        old.kill()
        w = Worker(self.settings, old.stage, wid, old.log_path, {**self.base_env, **(env or {})},
                   old.prefix, old.boot)
        w.starts = old.starts
        self.all[wid] = w
        return w.start()

    def start_pipeline(self, fetch: int = 1, **env_by_wid: dict[str, str]) -> None:
        """fetch-0..n-1, parse-0, retry-0 and store-0; then wait for the store to serve."""
        for stage, n in (("store", 1), ("parse", 1), ("retry", 1), ("fetch", fetch)):
            for i in range(n):
                wid = f"{stage}-{i}"
                self.start(stage, wid, env_by_wid.get(wid.replace("-", "_")))
        self.wait_store_ready()

    def wait_store_ready(self, timeout: float = 60.0) -> None:
        store = self.all["store-0"]

        def ready() -> bool:
            assert store.alive(), f"store died:\n{store.log_tail()}"
            return store_ready(self.settings)

        wait_until(ready, timeout, "the store worker to serve queries")

    def live(self) -> list[Worker]:
        return [w for w in self.all.values() if w.alive() and not w.frozen]

    def close(self) -> None:
        for w in self.all.values():
            if w.frozen:
                w.thaw()
        for w in self.all.values():
            if w.alive():
                assert w.proc is not None
                w.proc.send_signal(signal.SIGTERM)
        # An analytics worker (the faust quarantine app) gets the grace a crawl's fleet gives
        # it (crawlfleet.fleet.ANALYTICS_STOP_S): at least once by design, and a joined app
        # took the whole 20 s here before its SIGKILL.
        deadline = time.monotonic() + 20
        analytics_deadline = time.monotonic() + ANALYTICS_STOP_S
        analytics = analytics_stages()
        for w in self.all.values():
            if w.proc is None:
                continue
            until = analytics_deadline if w.stage in analytics else deadline
            try:
                w.proc.wait(max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(10)

    def logs(self) -> str:
        return "\n".join(f"----- {w.wid} -----\n{w.log_tail()}" for w in self.all.values())


#: Runs the worker CLI in a process whose wall clock is ``CRAWLFLEET_CLOCK_SKEW_S`` seconds
#: off: time.time/time_ns and datetime.now/utcnow are shifted before anything is imported.
#: CLOCK_MONOTONIC is a different clock and stays true, as on a host with a skewed clock.
#: (libfaketime 0.9.10 cannot do this here: it breaks Python 3.11's time.sleep.)
SKEWED_CLOCK_BOOT = """
import datetime as _dt, os, sys, time as _t
_skew = float(os.environ["CRAWLFLEET_CLOCK_SKEW_S"])
_time, _time_ns = _t.time, _t.time_ns
_t.time = lambda: _time() + _skew
_t.time_ns = lambda: _time_ns() + int(_skew * 1e9)
class _SkewedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return super().now(tz) + _dt.timedelta(seconds=_skew)
    @classmethod
    def utcnow(cls):
        return super().utcnow() + _dt.timedelta(seconds=_skew)
_dt.datetime = _SkewedDatetime
from crawlfleet.cli import app
sys.argv[0] = "crawlfleet"
app()
"""


# --- store -----------------------------------------------------------------------------------


def slow_sql(seconds: int) -> str:
    """A read-only query that holds the engine about ``seconds`` (a multiple of 3): chDB caps
    one sleep at 3 s, and readers may not set ``max_block_size`` (they run ``readonly``), so
    the sleeps are nested, each level waiting for the one below it."""
    sql = "SELECT sleep(3) AS x"
    for _ in range(max(1, seconds // 3) - 1):
        sql = f"SELECT sleep(3) + x AS x FROM ({sql})"
    return f"SELECT x AS s FROM ({sql})"  # one column, s: 0


def store_ready(settings: Settings) -> bool:
    """The store process is serving queries (never open chDB in the test process: asked over
    its endpoint only, as a stale port file left by a killed worker would otherwise make
    run_query open the path here)."""
    try:
        return query_owner(settings.clickhouse_path, "SELECT 1")[1] == [[1]]
    except (OSError, ValueError, CrawlfleetError):
        return False


def query(settings: Settings, sql: str) -> list[list[Any]]:
    """Rows of ``sql``, run by the live store worker (callers keep it alive meanwhile)."""
    assert (settings.clickhouse_path / PORT_FILE).exists(), "no live store worker to query"
    return run_query(settings, sql)[1]


def query_offline(settings: Settings, sql: str) -> list[list[Any]]:
    """Rows of ``sql`` while no store worker runs (e.g. it was killed): a short-lived child
    process opens the chDB path and exits, so the test process never holds chDB's lock."""
    code = ("import json, sys; from core.config import load_settings; "
            "from infra.store_query import run_query; "
            "print(json.dumps(run_query(load_settings(), sys.argv[1])[1], default=str))")
    env = {**os.environ, **settings_env(settings)}
    env.pop("CRAWLFLEET_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", code, sql], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, f"offline query failed: {out.stderr[-2000:]}"
    rows: list[list[Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def scalar(settings: Settings, sql: str) -> Any:
    return query(settings, sql)[0][0]


@dataclass(frozen=True)
class PageCounts:
    final: int  # rows after FINAL collapse
    raw: int  # rows physically stored (a replay differently cut shows up here)
    urls: int  # distinct URLs
    keys: int  # distinct dedupe keys


def page_counts(settings: Settings) -> PageCounts:
    final, urls, keys = query(settings, "SELECT count(), uniqExact(url), uniqExact(dedupe_key) "
                                        "FROM pages FINAL")[0]
    raw = scalar(settings, "SELECT count() FROM pages")
    return PageCounts(int(final), int(raw), int(urls), int(keys))


def stored_pages(settings: Settings) -> dict[str, int]:
    return {str(u): int(s) for u, s in query(settings, "SELECT url, status FROM pages FINAL")}


# --- Kafka -----------------------------------------------------------------------------------


def create_all_topics(settings: Settings) -> None:
    create_topics(settings)


def publish_seeds(settings: Settings, urls: Iterable[str]) -> int:
    report = publish(list(urls), settings)
    assert not report.errors, report.errors
    return report.published


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def read_topic(settings: Settings, topic: str, timeout: float = 30.0) -> list[Record]:
    """Every committed record of ``topic`` (read_committed, from the beginning, to the end)."""
    parts = settings.topic_partitions if topic != topology_of(settings).control else 1
    c = Consumer({**settings.kafka_common(), "group.id": f"faulttest-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "isolation.level": "read_committed",
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    out: list[Record] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
        pending = set(range(parts))
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for msg in c.consume(1000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                key = msg.key()
                out.append(Record(topic, msg.partition(), msg.offset(),
                                  key.encode() if isinstance(key, str) else key, msg.value(),
                                  [(k, v) for k, v in (msg.headers() or [])]))
    finally:
        c.close()
    return out


def key_counts(records: Iterable[Record]) -> collections.Counter[str]:
    return collections.Counter((r.key or b"").decode() for r in records)


def describe_fetch_results(records: Iterable[Record], keys: Iterable[str]) -> list[str]:
    """Who produced the FetchResults of ``keys``, where and when: for failure messages."""
    codec = default_codec()
    wanted = set(keys)
    out = []
    for r in records:
        k = (r.key or b"").decode()
        if k in wanted:
            v = codec.decode("FetchResult", r.value, r.headers)
            out.append(f"{k} p{r.partition}@{r.offset} worker={v['worker']} "
                       f"attempt={v['job']['attempt']} fetched_at_ms={v['fetched_at_ms']}")
    return sorted(out)


def group_assignment(settings: Settings, stage: str) -> dict[str, set[tuple[str, int]]]:
    """{client id (= worker id): assigned (topic, partition)s} of a stage's consumer group.

    The group assigns a stage's lead topic; its co-partitioned followers go with it (see
    ``Topology.subscription``), so they are listed too, *derived* from the lead's: a test of
    whether tiers stay together must read ``Worker.assignment`` instead. Empty while the
    group coordinator is not answering yet (fresh broker, moving group).
    """
    followers = topology_of(settings).followers(stage)
    out = lead_assignment(settings, stage)
    for tps in out.values():
        tps.update((f, p) for f in followers for _, p in list(tps))
    return out


def lead_assignment(settings: Settings, stage: str) -> dict[str, set[tuple[str, int]]]:
    """The group coordinator's own view: each member's lead-topic partitions only."""
    group = topology_of(settings).group(stage)
    admin = AdminClient(settings.kafka_common())
    try:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
    except KafkaException:
        return {}
    out: dict[str, set[tuple[str, int]]] = {}
    for m in desc.members:
        tps = m.assignment.topic_partitions if m.assignment else []
        out.setdefault(m.client_id, set()).update((tp.topic, tp.partition) for tp in tps)
    return out


def committed_offsets(settings: Settings, stage: str,
                      topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """The stage group's committed offset per (topic, partition) (-1001 when none)."""
    group = topology_of(settings).group(stage)
    c = Consumer({**settings.kafka_common(), "group.id": group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(settings.topic_partitions)]
        return {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=10)}
    finally:
        c.close()


def stage_lags(settings: Settings, unknown_wait_s: float = 10.0) -> dict[str, int]:
    """Every stage's lag as the broker holds it. -1 is "not known" (an end offset not
    answered within the probe's wait, as a fresh admin client's first look can be): the
    probe asks again for up to ``unknown_wait_s`` before a -1 is returned."""
    probe = LagProbe(settings)
    deadline = time.monotonic() + unknown_wait_s
    try:
        lags = probe.stage_lags(topology_of(settings))
        while -1 in lags.values() and time.monotonic() < deadline:
            time.sleep(0.2)
            lags = probe.stage_lags(topology_of(settings))
        return lags
    finally:
        probe.close()


def wait_drained(settings: Settings, workers: Workers, timeout: float,
                 ready: Callable[[], bool] = lambda: True, calm_s: float = 1.5,
                 give_up_s: float = 10.0) -> float:
    """Wait until every stage is at the end of its input and every live worker has been idle
    with nothing queued, in flight or held, for ``calm_s`` once ``ready()`` holds, or for
    ``give_up_s`` if it never does (work was lost: the caller's assertions say what);
    returns the seconds waited."""
    started = time.monotonic()
    calm_since: float | None = None

    def calm() -> bool:
        nonlocal calm_since
        for w in workers.all.values():
            if not w.alive() and w.stage == "store":
                raise AssertionError(f"store worker died:\n{w.log_tail()}")
        if not (_all_idle(workers) and all(v == 0 for v in stage_lags(settings, 0).values())):
            calm_since = None
            return False
        calm_since = calm_since or time.monotonic()
        quiet = time.monotonic() - calm_since
        return quiet >= give_up_s or (quiet >= calm_s and ready())

    try:
        wait_until(calm, timeout, "the pipeline to drain", interval=0.5)
    except AssertionError as exc:
        states = {w.wid: {k: w.status().get(k) for k in ("counters", "gauges", "idle_s")}
                  for w in workers.live()}
        raise AssertionError(f"{exc}\nready={ready()} lags={stage_lags(settings)}\n"
                             f"statuses={states}\n{workers.logs()}") from None
    return time.monotonic() - started


def _all_idle(workers: Workers) -> bool:
    for w in workers.live():
        s = w.status()
        if not s:
            return False
        g = s.get("gauges", {})
        if idle_for(s) < 1.0 or holds_work(g):
            return False
    return True


# --- a tiny hostile site -------------------------------------------------------------------


class CountingServer:
    """A loopback HTTP server with fixed answers per path, counting every request.

    ``routes`` maps a path to (status, body); anything else answers 404. ``delays`` holds
    seconds to wait before answering a path. Used for pages a demo site cannot express: a
    URL that always answers 500, or one so slow it holds back its partition's commit point.
    """

    def __init__(self, host: str, port: int, routes: dict[str, tuple[int, bytes]],
                 delays: dict[str, float] | None = None) -> None:
        assert host.startswith("127."), "test traffic stays on loopback"
        self.host, self.port, self.routes = host, port, routes
        self.delays = delays or {}
        self.requests: collections.Counter[str] = collections.Counter()
        self.first_at: dict[str, float] = {}  # time.monotonic() of each path's 1st request
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="counting-server")
        self._ready = threading.Event()
        self._runner: web.ServerRunner | None = None

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def count(self, path: str) -> int:
        with self._lock:
            return self.requests[path]

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        with self._lock:
            self.requests[request.raw_path] += 1
            self.first_at.setdefault(request.raw_path, time.monotonic())
        status, body = self.routes.get(request.raw_path, (404, b"not here"))
        if self.delays.get(request.raw_path):
            await asyncio.sleep(self.delays[request.raw_path])
        return web.Response(status=status, body=body,
                            headers={"Content-Type": "text/html; charset=utf-8"})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            self._runner = web.ServerRunner(web.Server(self._handle, access_log=None))
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port).start()

        self._loop.run_until_complete(listen())
        self._ready.set()
        self._loop.run_forever()
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def __enter__(self) -> CountingServer:
        self._thread.start()
        assert self._ready.wait(10), "counting server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def report(name: str, **figures: Any) -> None:
    """One greppable line of measured figures in the test output (run pytest with -s)."""
    print(f"\nFAULT-REPORT {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()),
          flush=True)


# --- forward proxies ---------------------------------------------------------------------------


class Proxy:
    """A real forward proxy (proxy.py) in a subprocess on loopback, logging each request
    it carries (``GET ip:port/path`` or ``CONNECT ip:port``) to its own file. With a ``tag``
    it names itself to the sites it reaches (header ``X-Test-Egress``, see
    :mod:`sites.egress_tag`), so a test site can refuse one egress."""

    def __init__(self, log: Path, tag: str = "") -> None:
        self.log = log
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        plugins = ["--plugins", "sites.egress_tag.EgressTagPlugin"] if tag else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", str(self.port),
             "--num-workers", "1", "--num-acceptors", "1", "--log-level", "INFO",
             "--log-file", str(log), *plugins], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env={**os.environ, "EGRESS_TAG": tag})

    def wait_ready(self) -> None:
        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return True
            except OSError:
                return False
        wait_until(up, 20, f"proxy on port {self.port}", interval=0.1)

    def carried(self) -> list[str]:
        """``ip:port/path`` of every request carried so far."""
        text = self.log.read_text() if self.log.exists() else ""
        return re.findall(r"access_log:\d+ - \S+ - (?:GET|CONNECT) (\S+)", text)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class OutputLines:
    """A child process's output, line by line as it comes (a reader thread), for tests
    that wait on what a command says while it runs."""

    def __init__(self, stream: Any, wait_s: float = 120.0) -> None:
        self.seen: list[str] = []
        self.wait_s = wait_s
        self._q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._q.put(line)

    def until(self, pattern: str) -> re.Match[str]:
        """The first line from now on matching ``pattern``, or fail after ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.seen)}")
