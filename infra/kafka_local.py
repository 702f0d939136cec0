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
    node-<id>/          server.properties, data/ (log.dirs), logs/ (server.log, stdout.log), pid

The jars are not in a home: ``kafka_jars`` keeps one runtime classpath per user and pom
(``~/.cache/crawlfleet/kafka-jars/<pom hash>``), so a new folder's broker starts without Maven.

Environment:
    CRAWLFLEET_HOME        root for local state (default ``./.crawlfleet``); Kafka uses ``kafka/``.
    CRAWLFLEET_KAFKA_JARS  jar directory to use instead of the per-user cache (e.g. a tarball's
                           ``libs/``, used as is). Filled by Maven if empty.
    CRAWLFLEET_KAFKA_PORT  base port of a new home's cluster (default 19092).
    XDG_CACHE_HOME         root of the per-user jar cache (default ``~/.cache``).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import InfraError
from infra.broker_process import is_our_broker, send_signal, terminate, wait_gone
from infra.kafka_home import (
    _LOG4J2,
    _MAIN_CLASS,
    _VALID_NODE_COUNTS,
    DEFAULT_BASE_PORT,
    HOST,
    INSTALL_HINT,
    JARS_ENV,
    PORT_ENV,
    ClusterStatus,
    NodeStatus,
    _check_compatible,
    _Cluster,
    _locked,
    _node_dir,
    _pid_path,
    _props_path,
    _read_cluster,
    _require_cluster,
    _require_tool,
    _tail,
    _write_cluster,
    broker_port,
    controller_port,
    default_base_port,
    kafka_home,
)
from infra.kafka_jars import (
    ensure_jars,
)

# The public API of a local cluster, including what the modules below it hold.
__all__ = ["DEFAULT_BASE_PORT", "HOST", "INSTALL_HINT", "JARS_ENV", "PORT_ENV", "ClusterStatus",
           "NodeStatus", "broker_port", "controller_port", "down", "ensure_jars", "freeze_node",
           "kafka_home", "node_pid", "restart_all", "start_node", "status", "stop_node",
           "thaw_node", "up"]

_log = logging.getLogger(__name__)


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
    text = _server_properties(home, cluster, node_id)
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return path  # unchanged: a node's format may be reading it right now
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- storage tool


def _storage_command(jars: str, *args: str) -> list[str]:
    return [_require_tool("java"), "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{jars}/*",
            "kafka.tools.StorageTool", *args]


def _random_cluster_id() -> str:
    """What Kafka's ``Uuid.randomUuid()`` (``StorageTool random-uuid``) makes: a version-4
    UUID's 16 bytes in base64url without padding, never starting with "-". Made here, not by
    the tool: its JVM start was a second of every fresh home's first broker start."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _is_formatted(home: Path, node_id: int) -> bool:
    return (_node_dir(home, node_id) / "data" / "meta.properties").exists()


def _format_command(home: Path, cluster: _Cluster, node_id: int) -> list[str]:
    """Format a node's log dir once (re-formatting would wipe its identity and data): run by
    the node's launcher right before the broker, so the caller need not wait for its JVM."""
    args = ["format", "-t", cluster.cluster_id, "-c", str(_props_path(home, node_id))]
    if cluster.nodes == 1:
        args.append("--standalone")
    return _storage_command(cluster.jars, *args)


# --------------------------------------------------------------------------- processes


def _read_pid(home: Path, node_id: int) -> int | None:
    return _read_pid_file(_pid_path(home, node_id))


def _read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _node_running(home: Path, node_id: int) -> tuple[int | None, bool]:
    pid = _read_pid(home, node_id)
    return pid, pid is not None and is_our_broker(pid, _props_path(home, node_id))


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
                    "if it is a crawlfleet broker started from another folder, use it "
                    f"with --bootstrap {HOST}:{broker_port(cluster.base_port, 1)} (or "
                    "CRAWLFLEET_BOOTSTRAP_SERVERS); or run every command from one folder, "
                    "or set CRAWLFLEET_HOME to one place for all of them"
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
# A new node's format runs first in the same background process, which then execs the broker
# (same pid: its command line names the broker's class and config all along, so the node counts
# as running, and a failed format ends it with its output in stdout.log).
_LAUNCHER = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
_FORMAT_LAUNCHER = 'log=$1; shift; ({format} && exec "$@") </dev/null >>"$log" 2>&1 & echo $!'


def _spawn(home: Path, cluster: _Cluster, node_id: int) -> int:
    """Start one detached broker JVM and record its pid.

    It runs in its logs dir, so a JVM crash file (hs_err_pid*.log) lands next to server.log.
    """
    logs = _node_dir(home, node_id) / "logs"
    script = _LAUNCHER if _is_formatted(home, node_id) else \
        _FORMAT_LAUNCHER.format(format=shlex.join(_format_command(home, cluster, node_id)))
    cmd = ["/bin/sh", "-c", script, "sh", str(logs / "stdout.log")]
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
    for node_id in stopped:  # a new node's format runs in its launcher (_FORMAT_LAUNCHER)
        _spawn(home, cluster, node_id)


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
        time.sleep(0.1)  # a crawl waits on this: a tenth of a second at most adds to it


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
    base_port: int | None = None,
    heap_mb: int = 512,
    timeout_s: float = 120.0,
    wait: bool = True,
) -> str:
    """Start (or adopt) the local cluster and return its bootstrap servers once all answer
    (at once with ``wait=False``: a caller with other work to do meanwhile, such as a crawl
    starting its workers, calls ``up()`` again to wait).

    Idempotent: running nodes are left alone, nodes whose process is gone are restarted on their
    existing data, and a fresh home is resolved, formatted and started from scratch. Without
    ``base_port``: the recorded cluster's, else ``$CRAWLFLEET_KAFKA_PORT`` or
    ``DEFAULT_BASE_PORT``.
    """
    if nodes not in _VALID_NODE_COUNTS:
        raise InfraError(f"nodes must be 1 or 3, not {nodes}")
    _require_tool("java")
    home = kafka_home(base_dir)
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / ".cluster.lock"):
        cluster = _prepare_cluster(home, nodes, base_port, heap_mb)
        _start_nodes(home, cluster, cluster.node_ids())
        if wait:
            _wait_ready(home, cluster, cluster.node_ids(), timeout_s)
    return cluster.bootstrap()


def _prepare_cluster(home: Path, nodes: int, base_port: int | None,
                     heap_mb: int) -> _Cluster:
    """Load the recorded cluster (checking it matches) or create and record a new one."""
    recorded = _read_cluster(home)
    if base_port is None:
        base_port = recorded.base_port if recorded is not None else default_base_port()
    if recorded is not None:
        _check_compatible(home, recorded, nodes, base_port)
    jars = ensure_jars(home)
    cluster_id = recorded.cluster_id if recorded else _random_cluster_id()
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
            if pid is not None and is_our_broker(pid, props):
                pids[pid] = props
        terminate(pids, timeout_s)
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
                send_signal(pid, signal.SIGKILL)
                if wait_gone(props, 10.0):
                    raise InfraError(f"Kafka node {node_id} (pid {pid}) survived SIGKILL")
            else:
                terminate(props, 30.0)
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
                send_signal(pid, signal.SIGKILL)  # a frozen node too: SIGKILL needs no SIGCONT
            if wait_gone(pids, 10.0):
                raise InfraError(f"Kafka processes {sorted(pids)} survived SIGKILL")
        else:
            terminate(pids, 30.0)
        for node_id in cluster.node_ids():
            _pid_path(home, node_id).unlink(missing_ok=True)
    if down_s > 0:
        time.sleep(down_s)
    with _locked(home / ".cluster.lock"):
        _start_nodes(home, cluster, cluster.node_ids())
        _wait_ready(home, cluster, cluster.node_ids(), timeout_s)
