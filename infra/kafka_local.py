"""A local KRaft Kafka cluster built from Maven Central jars: no Docker, no tarball.

Why: the pipeline, its tests and its chaos drills need a real broker (transactions, ISR, leader
failover), and the only things this machine can count on are Java, Maven and this repository.
``ensure_jars`` resolves ``infra/kafka/pom.xml`` once; ``up`` formats and starts 1 or 3 nodes as
detached JVMs that outlive the calling process; everything needed to find them again (ports,
cluster id, pids) lives on disk, so ``status``/``down``/``stop_node``/``start_node`` work from any
other process, as do the chaos soak's faults: ``freeze_node``/``thaw_node`` (SIGSTOP/SIGCONT, a
hung broker) and ``restart_all`` (every node killed at once and started again).

Layout under ``kafka_home()``::

    cluster.json        nodes, base_port, cluster id, heap, jar dir
    pom.xml             copy of infra/kafka/pom.xml that Maven ran on
    jars/               runtime classpath (+ .resolved marker holding the pom's hash)
    node-<id>/          server.properties, data/ (log.dirs), logs/ (server.log, stdout.log), pid

Environment:
    CRAWLFLEET_HOME        root for local state (default ``./.crawlfleet``); Kafka uses ``kafka/``.
    CRAWLFLEET_KAFKA_JARS  jar directory to use instead of ``<home>/jars``; lets tests and CI reuse
                           one download across many temporary homes. Filled by Maven if empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.errors import InfraError

DEFAULT_BASE_PORT = 19092
HOST = "127.0.0.1"
HOME_ENV = "CRAWLFLEET_HOME"
JARS_ENV = "CRAWLFLEET_KAFKA_JARS"
INSTALL_HINT = "apt-get install -y openjdk-17-jre-headless maven"

_RESOURCES = Path(__file__).resolve().parent / "kafka"
_POM = _RESOURCES / "pom.xml"
_LOG4J2 = _RESOURCES / "log4j2.xml"
_MARKER = ".resolved"
_CLUSTER_FILE = "cluster.json"
_MAIN_CLASS = "kafka.Kafka"
_MVN_TIMEOUT_S = 1800.0
_TOOL_TIMEOUT_S = 120.0
_TAIL_LINES = 20
_VALID_NODE_COUNTS = (1, 3)

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeStatus:
    """One node as seen from its pid file and /proc: no network round trip.

    ``pid`` is what the pid file says (None without one); it may be stale when not ``running``.
    """

    node_id: int
    pid: int | None
    running: bool
    broker_port: int
    controller_port: int


@dataclass(frozen=True)
class ClusterStatus:
    """The recorded cluster; empty ``nodes`` means no cluster was ever set up here."""

    nodes: tuple[NodeStatus, ...]
    bootstrap_servers: str

    @property
    def running(self) -> bool:
        """True only if a cluster exists and every one of its nodes is alive."""
        return bool(self.nodes) and all(n.running for n in self.nodes)


@dataclass(frozen=True)
class _Cluster:
    """What cluster.json records: enough to rebuild every node's config from another process."""

    nodes: int
    base_port: int
    cluster_id: str
    heap_mb: int
    jars: str

    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{broker_port(self.base_port, i)}" for i in self.node_ids())


# --------------------------------------------------------------------------- paths and ports


def kafka_home(base_dir: Path | None = None) -> Path:
    """Where this cluster's state lives: ``base_dir`` itself, else ``$CRAWLFLEET_HOME/kafka``."""
    if base_dir is not None:
        return Path(base_dir).expanduser().resolve()
    root = Path(os.environ.get(HOME_ENV) or ".crawlfleet").expanduser()
    return (root / "kafka").resolve()


def broker_port(base_port: int, node_id: int) -> int:
    """PLAINTEXT port of a node: two consecutive ports per node, broker first."""
    return base_port + 2 * (node_id - 1)


def controller_port(base_port: int, node_id: int) -> int:
    """CONTROLLER (KRaft quorum) port of a node, right after its broker port."""
    return broker_port(base_port, node_id) + 1


def _node_dir(home: Path, node_id: int) -> Path:
    return home / f"node-{node_id}"


def _props_path(home: Path, node_id: int) -> Path:
    return _node_dir(home, node_id) / "server.properties"


def _pid_path(home: Path, node_id: int) -> Path:
    return _node_dir(home, node_id) / "pid"


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    """Serialise concurrent callers (two CLIs, parallel tests) on one home or jar dir."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _require_tool(name: str) -> str:
    """Resolve a binary or fail with the one command that installs it."""
    path = shutil.which(name)
    if path is None:
        raise InfraError(f"`{name}` is not on PATH; install Java and Maven with: {INSTALL_HINT}")
    return path


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """Last lines of a log, for error messages that explain themselves."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- jars


def _pom_hash() -> str:
    return hashlib.sha256(_POM.read_bytes()).hexdigest()


def _jar_dir(home: Path) -> Path:
    override = os.environ.get(JARS_ENV)
    return Path(override).expanduser().resolve() if override else home / "jars"


def _has_kafka_jar(jar_dir: Path) -> bool:
    return any(jar_dir.glob("kafka_2.13-*.jar"))


def ensure_jars(base_dir: Path | None = None) -> Path:
    """Resolve the broker's runtime classpath with Maven once per pom version; return its dir.

    A marker file holding the pom's hash makes repeat calls free. A ``CRAWLFLEET_KAFKA_JARS``
    directory that already holds Kafka jars but no marker (e.g. a tarball's ``libs/``) is used
    as-is and never modified.
    """
    home = kafka_home(base_dir)
    jar_dir = _jar_dir(home)
    marker = jar_dir / _MARKER
    digest = _pom_hash()
    if _marker_matches(marker, digest):
        return jar_dir
    if not marker.exists() and _has_kafka_jar(jar_dir):
        return jar_dir
    with _locked(home / ".jars.lock"):
        if not _marker_matches(marker, digest):
            _resolve_jars(home, jar_dir)
            marker.write_text(digest + "\n")
    return jar_dir


def _marker_matches(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except OSError:
        return False


def _resolve_jars(home: Path, jar_dir: Path) -> None:
    """Run Maven into a clean jar dir so an old Kafka version never shares the classpath."""
    mvn = _require_tool("mvn")
    home.mkdir(parents=True, exist_ok=True)
    pom = home / "pom.xml"
    shutil.copyfile(_POM, pom)
    jar_dir.mkdir(parents=True, exist_ok=True)
    for stale in jar_dir.glob("*.jar"):
        stale.unlink()
    (jar_dir / _MARKER).unlink(missing_ok=True)
    cmd = [
        mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(pom),
        "dependency:copy-dependencies", "-DincludeScope=runtime",
        f"-DoutputDirectory={jar_dir}",
    ]  # fmt: skip
    _log.info("resolving Kafka jars with Maven into %s", jar_dir)
    proc = _run(cmd, _MVN_TIMEOUT_S, "Maven")
    if proc.returncode != 0 or not _has_kafka_jar(jar_dir):
        out = "\n".join((proc.stdout + proc.stderr).splitlines()[-_TAIL_LINES:])
        raise InfraError(
            f"Maven could not resolve Kafka jars from {pom} (is Maven Central reachable?):\n{out}"
        )


def _run(cmd: Sequence[str], timeout_s: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run a helper command, turning a hang into an InfraError instead of a stuck CLI."""
    try:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout_s,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"{what} did not finish within {timeout_s:.0f}s: {' '.join(cmd)}") from exc


# --------------------------------------------------------------------------- cluster record


def _read_cluster(home: Path) -> _Cluster | None:
    path = home / _CLUSTER_FILE
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
        return _Cluster(
            nodes=int(raw["nodes"]), base_port=int(raw["base_port"]),
            cluster_id=str(raw["cluster_id"]), heap_mb=int(raw["heap_mb"]),
            jars=str(raw["jars"]),
        )  # fmt: skip
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InfraError(f"{path} is unreadable ({exc}); remove {home} to start over") from exc


def _write_cluster(home: Path, cluster: _Cluster) -> None:
    """Atomic write, so a crash mid-write never leaves a cluster nobody can find again."""
    tmp = home / (_CLUSTER_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(cluster), indent=2) + "\n")
    tmp.replace(home / _CLUSTER_FILE)


def _require_cluster(home: Path) -> _Cluster:
    cluster = _read_cluster(home)
    if cluster is None:
        raise InfraError(f"no Kafka cluster recorded in {home}; run `crawlfleet kafka up` first")
    return cluster


def _check_compatible(home: Path, cluster: _Cluster, nodes: int, base_port: int) -> None:
    """Refuse to reshape a formatted cluster: its quorum and data are tied to nodes and ports."""
    if cluster.nodes == nodes and cluster.base_port == base_port:
        return
    raise InfraError(
        f"{home} holds a {cluster.nodes}-node cluster on base port {cluster.base_port}, but "
        f"{nodes} node(s) on base port {base_port} were requested. Run `crawlfleet kafka down` "
        f"first and pass a different --dir (or delete {home})."
    )


# --------------------------------------------------------------------------- configuration


def _server_properties(home: Path, cluster: _Cluster, node_id: int) -> str:
    """Combined broker+controller config; replication settings follow the node count."""
    base, n = cluster.base_port, cluster.nodes
    rf, min_isr = (1, 1) if n == 1 else (3, 2)
    props: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "listeners": f"PLAINTEXT://{HOST}:{broker_port(base, node_id)},"
        f"CONTROLLER://{HOST}:{controller_port(base, node_id)}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker_port(base, node_id)}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": _node_dir(home, node_id) / "data",
        "num.partitions": 1,
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": 0,
        "default.replication.factor": rf,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min_isr,
        # A local broker shares a laptop's (or CI's two) cores with every stage: few
        # threads, and internal topics sized for one machine (coordinators load faster).
        "num.network.threads": 2,
        "num.io.threads": 4,
        "offsets.topic.num.partitions": 8,
        "transaction.state.log.num.partitions": 8,
    }
    props.update(_quorum_props(cluster))
    lines = ["# Written by infra/kafka_local.py on every start; edits are overwritten."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def _quorum_props(cluster: _Cluster) -> dict[str, object]:
    """1 node: a dynamic standalone quorum. 3 nodes: a static voter list (no format flag)."""
    if cluster.nodes == 1:
        return {
            "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port(cluster.base_port, 1)}"
        }
    voters = ",".join(
        f"{i}@{HOST}:{controller_port(cluster.base_port, i)}" for i in cluster.node_ids()
    )
    return {"controller.quorum.voters": voters}


def _write_properties(home: Path, cluster: _Cluster, node_id: int) -> Path:
    node = _node_dir(home, node_id)
    for sub in ("data", "logs"):
        (node / sub).mkdir(parents=True, exist_ok=True)
    path = _props_path(home, node_id)
    path.write_text(_server_properties(home, cluster, node_id))
    return path


# --------------------------------------------------------------------------- storage tool


def _storage_tool(jars: str, *args: str) -> subprocess.CompletedProcess[str]:
    java = _require_tool("java")
    cmd = [java, "-Xmx256m", "-cp", f"{jars}/*", "kafka.tools.StorageTool", *args]
    return _run(cmd, _TOOL_TIMEOUT_S, "kafka StorageTool")


def _random_cluster_id(jars: Path) -> str:
    """Ask Kafka's own tool, so the id always has the format this Kafka version expects."""
    proc = _storage_tool(str(jars), "random-uuid")
    found = re.search(r"^[A-Za-z0-9_-]{22}$", proc.stdout, flags=re.MULTILINE)
    if proc.returncode != 0 or found is None:
        raise InfraError(f"StorageTool random-uuid failed:\n{proc.stdout}{proc.stderr}")
    return found.group(0)


def _is_formatted(home: Path, node_id: int) -> bool:
    return (_node_dir(home, node_id) / "data" / "meta.properties").exists()


def _format(home: Path, cluster: _Cluster, node_id: int) -> None:
    """Format a node's log dir once; re-formatting would wipe its identity and data."""
    if _is_formatted(home, node_id):
        return
    args = ["format", "-t", cluster.cluster_id, "-c", str(_props_path(home, node_id))]
    if cluster.nodes == 1:
        args.append("--standalone")
    proc = _storage_tool(cluster.jars, *args)
    if proc.returncode != 0:
        raise InfraError(f"formatting node {node_id} failed:\n{proc.stdout}{proc.stderr}")


# --------------------------------------------------------------------------- processes


def _read_pid(home: Path, node_id: int) -> int | None:
    return _read_pid_file(_pid_path(home, node_id))


def _read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_broker(pid: int, props: Path) -> bool:
    """True if pid is a live JVM running kafka.Kafka on this node's config (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):
        return False
    return _MAIN_CLASS.encode() in cmdline and str(props).encode() in cmdline


def _node_running(home: Path, node_id: int) -> tuple[int | None, bool]:
    pid = _read_pid(home, node_id)
    return pid, pid is not None and _is_our_broker(pid, _props_path(home, node_id))


def _port_free(port: int) -> bool:
    """Bind test with SO_REUSEADDR, as the JVM does, so TIME_WAIT sockets do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _check_ports(cluster: _Cluster, node_id: int, grace_s: float = 15.0) -> None:
    """Fail clearly if another program holds a node's port.

    A listener there is someone else's; a port that is merely unbindable is usually a killed
    node's sockets still closing, so that gets a short grace period.
    """
    ports = (broker_port(cluster.base_port, node_id), controller_port(cluster.base_port, node_id))
    deadline = time.monotonic() + grace_s
    for port in ports:
        while not _port_free(port):
            if _port_open(port) or time.monotonic() >= deadline:
                raise InfraError(
                    f"port {HOST}:{port} for Kafka node {node_id} is taken by another process; "
                    "stop it or use another base port and --dir"
                )
            time.sleep(0.2)


# A local broker shares two cores with every stage: C1-only JIT (no C2 tier) spends a fraction
# of the compile CPU a fresh JVM otherwise burns in its first minutes, for broker code that is
# network- and syscall-bound anyway.
_JIT_FLAGS = ("-XX:TieredStopAtLevel=1",)


def _java_command(home: Path, cluster: _Cluster, node_id: int) -> list[str]:
    node = _node_dir(home, node_id)
    heap = cluster.heap_mb
    return [
        _require_tool("java"), f"-Xms{heap}m", f"-Xmx{heap}m", "-XX:+UseG1GC", *_JIT_FLAGS,
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={_LOG4J2}", f"-Dkafka.logs.dir={node / 'logs'}",
        "-cp", f"{cluster.jars}/*", _MAIN_CLASS, str(_props_path(home, node_id)),
    ]  # fmt: skip


# The shell backgrounds the JVM and exits at once, so the broker is re-parented to init: it is
# never our child (no zombie, no ResourceWarning) and it outlives this Python process. The new
# session (start_new_session) keeps terminal hang-ups and Ctrl-C of the caller away from it.
_LAUNCHER = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'


def _spawn(home: Path, cluster: _Cluster, node_id: int) -> int:
    """Start one detached broker JVM and record its pid.

    It runs in its logs dir, so a JVM crash file (hs_err_pid*.log) lands next to server.log.
    """
    logs = _node_dir(home, node_id) / "logs"
    cmd = ["/bin/sh", "-c", _LAUNCHER, "sh", str(logs / "stdout.log")]
    cmd += _java_command(home, cluster, node_id)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, start_new_session=True, cwd=logs, timeout=30,
        check=False,
    )  # fmt: skip
    try:
        pid = int(proc.stdout.strip())
    except ValueError as exc:
        raise InfraError(f"could not start Kafka node {node_id}: {proc.stderr.strip()}") from exc
    _pid_path(home, node_id).write_text(f"{pid}\n")
    _log.info("started Kafka node %d (pid %d)", node_id, pid)
    return pid


def _start_nodes(home: Path, cluster: _Cluster, node_ids: Sequence[int]) -> None:
    """(Re)write config, format new nodes, and launch every node that is not running."""
    stopped = []
    for node_id in node_ids:
        _write_properties(home, cluster, node_id)
        if not _node_running(home, node_id)[1]:
            _pid_path(home, node_id).unlink(missing_ok=True)
            _check_ports(cluster, node_id)
            stopped.append(node_id)
    # Each format is a JVM start; running them side by side saves seconds on a 3-node cluster.
    with ThreadPoolExecutor(max_workers=max(1, len(stopped))) as pool:
        list(pool.map(lambda node_id: _format(home, cluster, node_id), stopped))
    for node_id in stopped:
        _spawn(home, cluster, node_id)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pids: dict[int, Path], timeout_s: float) -> dict[int, Path]:
    """Poll until the processes exit; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    alive = dict(pids)
    while alive:
        alive = {pid: props for pid, props in alive.items() if _is_our_broker(pid, props)}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return alive


def _terminate(pids: dict[int, Path], timeout_s: float) -> None:
    """SIGTERM (controlled shutdown), then SIGKILL whatever is still there at the deadline."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    leftovers = _wait_gone(pids, timeout_s)
    for pid in leftovers:
        _log.warning("Kafka pid %d ignored SIGTERM for %.0fs; killing it", pid, timeout_s)
        _signal(pid, signal.SIGKILL)
    if _wait_gone(leftovers, 10.0):
        raise InfraError(f"Kafka processes {sorted(leftovers)} survived SIGKILL")


# --------------------------------------------------------------------------- readiness


def _quiet_logger() -> logging.Logger:
    """librdkafka logs every refused connection while a broker boots; that is expected here."""
    logger = logging.getLogger(f"{__name__}.probe")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


def _probe(port: int, expected_brokers: int, node_id: int) -> bool:
    """True if the node on ``port`` answers metadata itself and sees the whole cluster.

    A fresh client knows only this port, so any answer came from this node; and a KRaft broker
    opens its listener only once registered and unfenced, so an answer means it is serving.
    """
    if not _port_open(port):
        return False
    from confluent_kafka.admin import AdminClient  # heavy import; only needed when waiting

    conf: dict[str, Any] = {
        "bootstrap.servers": f"{HOST}:{port}",
        "logger": _quiet_logger(),
        "socket.connection.setup.timeout.ms": 2000,
    }
    try:
        meta = AdminClient(conf).list_topics(timeout=3)
    except Exception:  # KafkaException while the broker is still starting
        return False
    return node_id in meta.brokers and len(meta.brokers) == expected_brokers


def _wait_ready(home: Path, cluster: _Cluster, node_ids: Sequence[int], timeout_s: float) -> None:
    """Block until each node answers, failing fast with its log tail if a JVM dies."""
    deadline = time.monotonic() + timeout_s
    pending = list(node_ids)
    while pending:
        node_id = pending[0]
        if not _node_running(home, node_id)[1]:
            raise InfraError(f"Kafka node {node_id} exited during startup.\n{_logs(home, node_id)}")
        if _probe(broker_port(cluster.base_port, node_id), cluster.nodes, node_id):
            pending.pop(0)
            continue
        if time.monotonic() >= deadline:
            raise InfraError(
                f"Kafka node {node_id} did not answer on {HOST}:"
                f"{broker_port(cluster.base_port, node_id)} within {timeout_s:.0f}s; it is left "
                f"running (`crawlfleet kafka down` stops it).\n{_logs(home, node_id)}"
            )
        time.sleep(0.5)


def _logs(home: Path, node_id: int) -> str:
    logs = _node_dir(home, node_id) / "logs"
    parts = []
    for name in ("server.log", "stdout.log"):
        tail = _tail(logs / name)
        if tail:
            parts.append(f"--- last lines of {logs / name} ---\n{tail}")
    return "\n".join(parts) or f"(no logs in {logs})"


# --------------------------------------------------------------------------- public API


def up(
    nodes: int = 1,
    base_dir: Path | None = None,
    base_port: int = DEFAULT_BASE_PORT,
    heap_mb: int = 512,
    timeout_s: float = 120.0,
) -> str:
    """Start (or adopt) the local cluster and return its bootstrap servers once all answer.

    Idempotent: running nodes are left alone, nodes whose process is gone are restarted on their
    existing data, and a fresh home is resolved, formatted and started from scratch.
    """
    if nodes not in _VALID_NODE_COUNTS:
        raise InfraError(f"nodes must be 1 or 3, not {nodes}")
    _require_tool("java")
    home = kafka_home(base_dir)
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / ".cluster.lock"):
        cluster = _prepare_cluster(home, nodes, base_port, heap_mb)
        _start_nodes(home, cluster, cluster.node_ids())
        _wait_ready(home, cluster, cluster.node_ids(), timeout_s)
    return cluster.bootstrap()


def _prepare_cluster(home: Path, nodes: int, base_port: int, heap_mb: int) -> _Cluster:
    """Load the recorded cluster (checking it matches) or create and record a new one."""
    recorded = _read_cluster(home)
    if recorded is not None:
        _check_compatible(home, recorded, nodes, base_port)
    jars = ensure_jars(home)
    cluster_id = recorded.cluster_id if recorded else _random_cluster_id(jars)
    cluster = _Cluster(nodes, base_port, cluster_id, heap_mb, str(jars))
    _write_cluster(home, cluster)
    return cluster


def status(base_dir: Path | None = None) -> ClusterStatus:
    """Describe the recorded cluster from pid files and /proc (cheap, no broker round trip)."""
    home = kafka_home(base_dir)
    cluster = _read_cluster(home)
    if cluster is None:
        return ClusterStatus(nodes=(), bootstrap_servers="")
    found = []
    for node_id in cluster.node_ids():
        pid, running = _node_running(home, node_id)
        found.append(NodeStatus(
            node_id=node_id, pid=pid, running=running,
            broker_port=broker_port(cluster.base_port, node_id),
            controller_port=controller_port(cluster.base_port, node_id),
        ))  # fmt: skip
    return ClusterStatus(nodes=tuple(found), bootstrap_servers=cluster.bootstrap())


def down(base_dir: Path | None = None, timeout_s: float = 30.0) -> None:
    """Stop every node this home started; data, config and jars stay for the next ``up``."""
    home = kafka_home(base_dir)
    if not home.is_dir():
        return
    with _locked(home / ".cluster.lock"):
        pids: dict[int, Path] = {}
        pid_files = sorted(home.glob("node-*/pid"))
        for pid_file in pid_files:
            pid = _read_pid_file(pid_file)
            props = pid_file.parent / "server.properties"
            if pid is not None and _is_our_broker(pid, props):
                pids[pid] = props
        _terminate(pids, timeout_s)
        for pid_file in pid_files:
            pid_file.unlink(missing_ok=True)


def stop_node(node_id: int, base_dir: Path | None = None, hard: bool = True) -> None:
    """Crash (SIGKILL) or stop (SIGTERM, then SIGKILL after 30s) one node, for chaos tests."""
    home = kafka_home(base_dir)
    cluster = _require_cluster(home)
    _check_node_id(cluster, node_id)
    with _locked(home / ".cluster.lock"):
        pid, running = _node_running(home, node_id)
        if pid is not None and running:
            props = {pid: _props_path(home, node_id)}
            if hard:
                _signal(pid, signal.SIGKILL)
                if _wait_gone(props, 10.0):
                    raise InfraError(f"Kafka node {node_id} (pid {pid}) survived SIGKILL")
            else:
                _terminate(props, 30.0)
        _pid_path(home, node_id).unlink(missing_ok=True)


def start_node(node_id: int, base_dir: Path | None = None, timeout_s: float = 60.0) -> None:
    """Restart one node of the recorded cluster on its existing config and data.

    After a crash expect ~9s: the controller refuses the new incarnation until the old one's
    session (broker.session.timeout.ms) expires.
    """
    home = kafka_home(base_dir)
    cluster = _require_cluster(home)
    _check_node_id(cluster, node_id)
    with _locked(home / ".cluster.lock"):
        _start_nodes(home, cluster, [node_id])
        _wait_ready(home, cluster, [node_id], timeout_s)


def _check_node_id(cluster: _Cluster, node_id: int) -> None:
    if node_id not in cluster.node_ids():
        raise InfraError(
            f"node {node_id} is not part of this {cluster.nodes}-node cluster "
            f"(ids 1..{cluster.nodes})"
        )


def node_pid(node_id: int, base_dir: Path | None = None) -> int | None:
    """The pid of a running node (a SIGSTOPped one counts as running), else None."""
    home = kafka_home(base_dir)
    _check_node_id(_require_cluster(home), node_id)
    pid, running = _node_running(home, node_id)
    return pid if running else None


def freeze_node(node_id: int, base_dir: Path | None = None) -> int:
    """SIGSTOP one node: a hung broker, not a dead one (its sockets stay open, nothing
    answers). Returns the pid, for :func:`thaw_node`; the caller must thaw it."""
    pid = node_pid(node_id, base_dir)
    if pid is None:
        raise InfraError(f"Kafka node {node_id} is not running: nothing to freeze")
    os.kill(pid, signal.SIGSTOP)
    # Every thread of the JVM stops, asynchronously: return once the process is stopped.
    deadline = time.monotonic() + 5.0
    while _proc_state(pid) not in ("T", "t", "") and time.monotonic() < deadline:
        time.sleep(0.02)
    _log.info("froze Kafka node %d (pid %d)", node_id, pid)
    return pid


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def thaw_node(node_id: int, base_dir: Path | None = None) -> None:
    """SIGCONT a node :func:`freeze_node` stopped (a no-op for a running one)."""
    pid = node_pid(node_id, base_dir)
    if pid is not None:
        os.kill(pid, signal.SIGCONT)
        _log.info("thawed Kafka node %d (pid %d)", node_id, pid)


def restart_all(base_dir: Path | None = None, hard: bool = True, down_s: float = 0.0,
                timeout_s: float = 120.0) -> None:
    """Stop every node at once (SIGKILL, or SIGTERM with ``hard=False``), wait ``down_s``,
    and start them all again on their data: a whole-cluster outage, as a power cut makes."""
    home = kafka_home(base_dir)
    cluster = _require_cluster(home)
    with _locked(home / ".cluster.lock"):
        pids: dict[int, Path] = {}
        for node_id in cluster.node_ids():
            pid, running = _node_running(home, node_id)
            if pid is not None and running:
                pids[pid] = _props_path(home, node_id)
        if hard:
            for pid in pids:
                _signal(pid, signal.SIGKILL)  # a frozen node too: SIGKILL needs no SIGCONT
            if _wait_gone(pids, 10.0):
                raise InfraError(f"Kafka processes {sorted(pids)} survived SIGKILL")
        else:
            _terminate(pids, 30.0)
        for node_id in cluster.node_ids():
            _pid_path(home, node_id).unlink(missing_ok=True)
    if down_s > 0:
        time.sleep(down_s)
    with _locked(home / ".cluster.lock"):
        _start_nodes(home, cluster, cluster.node_ids())
        _wait_ready(home, cluster, cluster.node_ids(), timeout_s)
