"""The broker's jars, resolved once by Maven from ``infra/kafka/pom.xml`` (Maven Central) into
``<home>/jars`` or ``CRAWLFLEET_KAFKA_JARS``, and found again by the pom's hash."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from core.errors import InfraError
from infra.kafka_home import (
    _MARKER,
    _MVN_TIMEOUT_S,
    _POM,
    _TAIL_LINES,
    JARS_ENV,
    _locked,
    _require_tool,
    kafka_home,
)

_log = logging.getLogger(__name__)


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
