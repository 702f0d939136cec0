"""``infra/deploy/compose.yaml`` run without Docker, as far as this machine allows.

The file is parsed and each service is run from what it says: every worker service's
command (behind the image's ENTRYPOINT) with its environment, its data dir on its named
volume (a directory per volume, kept across a recreate), its healthcheck run as written.
What cannot run here is replaced, and checked against the file instead:

- the three ``apache/kafka`` services: their env is mapped onto ``infra/kafka_local.py``'s
  three KRaft nodes (real brokers from Maven Central jars, on loopback), and every broker
  setting the file gives is checked to be the one those nodes run with;
- the ``clickhouse`` service: the store worker uses the embedded chDB store on its own
  state volume instead (the DSN secret is dropped);
- hostnames: the brokers' names become their loopback ports, each worker's
  ``metrics_bind`` (0.0.0.0 in a container) becomes an address of its own (127.0.1.N);
- the user: the image runs as 65534, but this machine's interpreter lives under /root
  (mode 0700), which 65534 cannot reach: the workers run as the test's user.

Then: the ``topics`` service runs to completion, every worker's healthcheck passes
(/ready: joined, restored, consuming), a crawl of a local site goes through them, fetch-0
is killed (kill -9) and re-created from its service (same command, same volume: the same
worker id), and every page is stored exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet_helpers import page_counts, publish_seeds, report, stage_lags, wait_until

from core.config import Settings, load_settings
from infra import kafka_local
from infra.kafka_home import broker_port, controller_port
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "infra" / "deploy"
#: Three nodes of our own, beside the session's broker (TEST_KAFKA_PORT) and clear of it.
BASE_PORT = int(os.environ.get("TEST_KAFKA_PORT", "28092")) + 40
#: Settings the file does not give and this test must: loopback sites are private
#: addresses, and a faster cap than 2 req/s keeps the crawl short.
TEST_ONLY = {"CRAWLFLEET_ALLOW_PRIVATE": "true", "CRAWLFLEET_RATE_CAP": "25"}
#: Broker settings whose values name hosts, ports, paths or ids: mapped, not compared.
MAPPED = {"KAFKA_NODE_ID", "KAFKA_CONTROLLER_QUORUM_VOTERS", "KAFKA_LISTENERS",
          "KAFKA_ADVERTISED_LISTENERS", "KAFKA_LOG_DIRS", "CLUSTER_ID"}


def _entrypoint() -> list[str]:
    (line,) = [ln for ln in (DEPLOY / "Dockerfile").read_text().splitlines()
               if ln.startswith("ENTRYPOINT ")]
    entry: list[str] = json.loads(line.removeprefix("ENTRYPOINT "))
    assert entry == ["crawlfleet"], entry  # the console script: crawlfleet.cli's app
    return [sys.executable, "-m", "crawlfleet.cli"]


@dataclass
class Service:
    """One compose service run as a local process; its named volumes are directories."""

    name: str
    spec: dict[str, Any]
    env: dict[str, str]
    bind: str
    volumes: dict[str, Path]  # mount path -> the volume's directory
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = field(default=0)

    def start(self) -> Service:
        with self.log.open("ab") as out:
            out.write(f"=== start #{self.starts + 1} of {self.name} ===\n".encode())
            out.flush()
            self.proc = subprocess.Popen([*_entrypoint(), *self.spec["command"]], env=self.env,
                                         cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self.starts += 1
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def healthy(self) -> bool:
        """The service's own healthcheck, run as written (its address mapped)."""
        kind, exe, *args = self.spec["healthcheck"]["test"]
        assert (kind, exe) == ("CMD", "python")
        args = [a.replace("127.0.0.1:", f"{self.bind}:") for a in args]
        return subprocess.run([sys.executable, *args], capture_output=True, timeout=10,
                              check=False).returncode == 0

    def readiness(self) -> str:
        """What /ready says (for a failure's message)."""
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://{self.bind}:9400/ready", timeout=3) as r:
                return str(r.read().decode())
        except urllib.error.HTTPError as exc:
            return str(exc.read().decode())
        except OSError as exc:
            return f"no answer: {exc}"

    @property
    def data_dir(self) -> Path:
        return self.volumes[self.spec["environment"]["CRAWLFLEET_DATA_DIR"]]

    def status(self) -> dict[str, Any]:
        stage = self.spec["command"][1]
        found = list((self.data_dir / "status").glob(f"*/{stage}-*.json"))
        return json.loads(found[0].read_text()) if found else {}

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _local_env(spec: dict[str, Any], volumes: dict[str, Path], brokers: dict[str, str],
               bind: str) -> dict[str, str]:
    """The service's environment with its container-only values mapped onto this host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    for key, value in spec["environment"].items():
        value = str(value)
        if key == "CRAWLFLEET_BOOTSTRAP_SERVERS":
            value = ",".join(brokers[s.strip()] for s in value.split(","))
        elif key == "CRAWLFLEET_CLICKHOUSE_DSN_FILE":
            assert "clickhouse_dsn" in spec["secrets"]
            continue  # the ClickHouse service is replaced by the embedded store
        elif key == "CRAWLFLEET_DATA_DIR":
            value = str(volumes[value])  # KeyError: no volume at the data dir
        elif key == "CRAWLFLEET_METRICS_BIND":
            value = bind
        env[key] = value
    return {**env, **TEST_ONLY}


def _mounts(spec: dict[str, Any], root: Path, declared: set[str]) -> dict[str, Path]:
    out = {}
    for item in spec.get("volumes", []):
        name, path = item.split(":", 1)
        assert name in declared, f"{item}: not a named volume"
        out[path] = root / name
        out[path].mkdir(parents=True, exist_ok=True)
    return out


def _check_brokers_as_kafka_local_runs_them(services: dict[str, Any], home: Path) -> None:
    """Every broker setting the compose file gives is the one the local nodes run with."""
    for node in (1, 2, 3):
        env = services[f"kafka-{node}"]["environment"]
        assert int(env["KAFKA_NODE_ID"]) == node
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://kafka-{node}:9092"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == \
            ",".join(f"{i}@kafka-{i}:9093" for i in (1, 2, 3))
        props = dict(line.split("=", 1) for line in
                     (home / f"node-{node}" / "server.properties").read_text().splitlines()
                     if "=" in line and not line.startswith("#"))
        assert props["controller.quorum.voters"] == ",".join(
            f"{i}@127.0.0.1:{controller_port(BASE_PORT, i)}" for i in (1, 2, 3))
        for key, value in env.items():
            if key.startswith("KAFKA_") and key not in MAPPED:
                prop = key.removeprefix("KAFKA_").lower().replace("_", ".")
                assert props.get(prop, "").lower() == str(value).lower(), (key, props, value)


@pytest.fixture
def three_brokers(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "kafka"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kafka_local.JARS_ENV, str(kafka_local.ensure_jars()))
        kafka_local.up(nodes=3, base_dir=home, base_port=BASE_PORT, heap_mb=320)
        try:
            yield home
        finally:
            kafka_local.down(home)


def test_the_compose_file_runs_a_fleet_that_crawls_and_survives_a_recreate(
        three_brokers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services, declared = compose["services"], set(compose["volumes"])
    _check_brokers_as_kafka_local_runs_them(services, three_brokers)
    brokers = {f"kafka-{i}:9092": f"127.0.0.1:{broker_port(BASE_PORT, i)}" for i in (1, 2, 3)}
    workers = [n for n, s in services.items() if s.get("command", [None])[0] == "worker"]
    assert "quarantine-0" in workers and "fetch-1" in workers
    run: dict[str, Service] = {}
    for i, name in enumerate(["topics", *workers]):
        spec = services[name]
        vols = _mounts(spec, tmp_path / "volumes", declared)
        if name == "topics":  # a one-shot: the image's VOLUME, an anonymous one
            vols.setdefault(spec["environment"]["CRAWLFLEET_DATA_DIR"], tmp_path / "anon")
        bind = f"127.0.1.{i + 1}"
        run[name] = Service(name, spec, _local_env(spec, vols, brokers, bind), bind, vols,
                            tmp_path / f"{name}.log")
    # depends_on: the topics once, to completion; then every worker
    topics = run["topics"].start()
    assert topics.proc is not None and topics.proc.wait(120) == 0, topics.tail()
    try:
        for name in workers:
            run[name].start()
        try:
            wait_until(lambda: all(run[n].healthy() for n in workers), 90,
                       "every worker's healthcheck (/ready)", interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(
                f"{n}: {run[n].readiness()}\n{run[n].tail()[-800:]}" for n in workers
                if not run[n].healthy())) from None
        ready_at = time.monotonic() - started
        hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
        n = 60  # per host
        with BehaviourSite(free_port(hosts, 18860), {h: Behaviour() for h in hosts}) as site:
            for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
                monkeypatch.delenv(key)
            publisher = load_settings(bootstrap_servers=",".join(brokers.values()),
                                      replication=3, data_dir=tmp_path / "publisher",
                                      allow_private=True)
            store = Settings(data_dir=run["store-0"].data_dir)
            urls = [u for h in hosts for u in site.urls(h, n)]
            publish_seeds(publisher, urls)
            wait_until(lambda: len(site.pages()) >= len(urls) // 4, 60, "a quarter fetched")
            fetch0 = run["fetch-0"]
            state_before = sorted(p.name for p in fetch0.data_dir.rglob("*") if p.is_dir())
            peer_rebalances = run["fetch-1"].status()["rebalances"]
            fetch0.kill()
            fetch0.start()  # re-created: same service, same volume
            assert fetch0.proc is not None
            new_pid = fetch0.proc.pid
            wait_until(lambda: fetch0.status().get("pid") == new_pid
                       and fetch0.status().get("rebalances", 0) > 0, 60,
                       "the re-created fetch-0 to rejoin")
            recreated = fetch0.status()
            wait_until(lambda: page_counts(store).final >= len(urls)
                       and all(v == 0 for v in stage_lags(publisher, 0).values()), 90,
                       "every page stored")
            counts = page_counts(store)
            peer_rebalances = run["fetch-1"].status()["rebalances"] - peer_rebalances
            requested = len(site.pages())
        for name in workers:
            assert run[name].proc is not None and run[name].proc.poll() is None, \
                f"{name} died:\n{run[name].tail()}"
    finally:
        for s in run.values():  # all at once, as `docker compose down` stops them
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        for s in run.values():
            s.stop()
    assert recreated["worker"] == "fetch-0"  # the id is the service's, not the container's
    assert state_before and (fetch0.data_dir / "status").is_dir()
    assert counts.final == counts.urls == counts.keys == len(urls), counts  # none lost/twice
    report("compose_fleet", pages=counts.final, raw_rows=counts.raw, requests=requested,
           peer_rebalances_during_recreate=peer_rebalances,
           ready_s=round(ready_at, 1), total_s=round(time.monotonic() - started, 1))
