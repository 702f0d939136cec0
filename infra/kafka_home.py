"""Where a local Kafka cluster lives on disk and what it records there: the home, each
node's directory, ports and pid file, the cluster record (``cluster.json``), and the statuses
read from them. Shared by the jar resolver and the broker processes (``kafka_local``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.errors import InfraError

DEFAULT_BASE_PORT = 19092
HOST = "127.0.0.1"
HOME_ENV = "CRAWLFLEET_HOME"
JARS_ENV = "CRAWLFLEET_KAFKA_JARS"
#: The base port of a new home's cluster when none is given (a recorded cluster keeps its own).
PORT_ENV = "CRAWLFLEET_KAFKA_PORT"
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


def default_base_port() -> int:
    """``$CRAWLFLEET_KAFKA_PORT``, else ``DEFAULT_BASE_PORT``: a fresh folder's broker on a
    port of its own (a benchmark's, beside a broker another folder runs on the default)."""
    raw = os.environ.get(PORT_ENV, "")
    try:
        port = int(raw) if raw else DEFAULT_BASE_PORT
    except ValueError:
        raise InfraError(f"{PORT_ENV}={raw!r} is not a port number") from None
    if not 1024 <= port <= 65533:
        raise InfraError(f"{PORT_ENV}={port} is outside 1024..65533")
    return port


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
