"""The broker's jars, resolved by Maven from ``infra/kafka/pom.xml`` (Maven Central) once per
user and pom: into ``$XDG_CACHE_HOME/crawlfleet/kafka-jars/<pom hash>`` (default
``~/.cache``), or into ``CRAWLFLEET_KAFKA_JARS`` when that is set.

Why per user, not per broker home: a home is ``.crawlfleet/kafka`` under the folder a command
runs from, and a jar dir inside it had every new folder's first broker start wait for Maven
(seconds even with a warm ``~/.m2``, minutes without one). Keyed by the pom's hash, so a
changed pom resolves afresh beside the old jars and never mixes versions on one classpath.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
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

#: The per-user cache root: ``$XDG_CACHE_HOME`` (the XDG base-directory spec), else ``~/.cache``.
CACHE_ENV = "XDG_CACHE_HOME"
#: How many hex digits of the pom's sha256 name its cache dir (64 bits: no clash in practice).
_KEY_DIGITS = 16


# --------------------------------------------------------------------------- where (pure)


def pom_hash(pom: bytes) -> str:
    """The key of a pom's jars: its bytes' sha256 (any edit resolves afresh)."""
    return hashlib.sha256(pom).hexdigest()


def jar_cache_root(env: Mapping[str, str], user_home: Path) -> Path:
    """``$XDG_CACHE_HOME/crawlfleet/kafka-jars``; a relative or empty value is ignored, as
    the XDG spec says, for ``~/.cache``."""
    base = env.get(CACHE_ENV, "")
    root = Path(base) if base and Path(base).is_absolute() else user_home / ".cache"
    return root / "crawlfleet" / "kafka-jars"


def jar_dir_for(digest: str, env: Mapping[str, str], user_home: Path) -> Path:
    """Where the jars of the pom with hash ``digest`` live: ``CRAWLFLEET_KAFKA_JARS`` if set
    (whatever the pom), else the per-user cache's dir for this pom."""
    override = env.get(JARS_ENV, "")
    if override:
        return Path(override).expanduser().resolve()
    return jar_cache_root(env, user_home) / digest[:_KEY_DIGITS]


# --------------------------------------------------------------------------- resolving


def _pom_hash() -> str:
    return pom_hash(_POM.read_bytes())


def _has_kafka_jar(jar_dir: Path) -> bool:
    return any(jar_dir.glob("kafka_2.13-*.jar"))


def ensure_jars(base_dir: Path | None = None) -> Path:
    """Resolve the broker's runtime classpath once per user and pom version; return its dir.

    A marker file holding the pom's hash makes repeat calls free (one small read). A
    ``CRAWLFLEET_KAFKA_JARS`` directory that already holds Kafka jars but no marker (e.g. a
    tarball's ``libs/``) is used as-is and never modified. Two processes resolving at once
    are serialised by a lock beside the dir; the cache's dir appears whole (renamed into
    place) or not at all. A broker home of the former layout whose ``jars/`` holds this
    pom's jars seeds the cache by a copy instead of Maven (``base_dir``: that home).
    """
    digest = _pom_hash()
    jar_dir = jar_dir_for(digest, os.environ, Path.home())
    marker = jar_dir / _MARKER
    if _marker_matches(marker, digest):
        return jar_dir
    if os.environ.get(JARS_ENV):
        if not marker.exists() and _has_kafka_jar(jar_dir):
            return jar_dir
        with _locked(jar_dir.parent / f".{jar_dir.name}.lock"):
            if not _marker_matches(marker, digest):
                work = jar_dir.parent / f".{jar_dir.name}.maven"
                _resolve_jars(work, jar_dir)
                marker.write_text(digest + "\n")
                shutil.rmtree(work, ignore_errors=True)
        return jar_dir
    with _locked(jar_dir.parent / f".{jar_dir.name}.lock"):
        if not _marker_matches(marker, digest):
            _fill_cache(jar_dir, digest, kafka_home(base_dir) / "jars")
    return jar_dir


def _fill_cache(jar_dir: Path, digest: str, legacy: Path) -> None:
    """Resolve (or copy from a former home's ``jars/``) into a staging dir, then rename it
    into place: a reader that takes no lock never sees half a classpath."""
    staging = jar_dir.parent / f".{jar_dir.name}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    if _marker_matches(legacy / _MARKER, digest):
        _log.info("copying Kafka jars from %s into %s", legacy, jar_dir)
        shutil.copytree(legacy, staging / "jars")
    else:
        _resolve_jars(staging, staging / "jars")
    (staging / "jars" / _MARKER).write_text(digest + "\n")
    shutil.rmtree(jar_dir, ignore_errors=True)  # a dir left without its marker
    (staging / "jars").rename(jar_dir)
    shutil.rmtree(staging, ignore_errors=True)


def _marker_matches(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except OSError:
        return False


def _resolve_jars(work: Path, jar_dir: Path) -> None:
    """Run Maven (on a copy of the pom in ``work``) into a clean jar dir, so an old Kafka
    version never shares the classpath."""
    mvn = _require_tool("mvn")
    work.mkdir(parents=True, exist_ok=True)
    pom = work / "pom.xml"
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
