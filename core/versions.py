"""The version tuple: what a dashboard splits success and block rates by, and what the
fleet's approved set admits (a new fetcher, HTTP library, TLS library or profile bundle).

A worker's tuple is (profile bundle version, HTTP library version, TLS library version,
code revision). The bundle is the configuration's ``profile_bundle_version``: the version
of the whole set of profiles a worker is deployed with (each profile's own
``bundle_version`` is part of that configuration). The code revision is, in this order:
``Settings.code_revision`` when set; the revision a built wheel carries
(``core/_build_revision.py``, written by ``buildsupport.revision`` at build time: an
installed package has no checkout to read); the git commit of the checkout it runs from
(``+dirty`` when tracked files differ from it); else the package version.

One canonical string form, parsed back strictly (the form ``crawlfleet approve`` takes)::

    bundle=1;http=aiohttp/3.14.5;tls=OpenSSL 3.0.13 30 Jan 2024;code=1a2b3c4d5e6f
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from pathlib import Path

from core import __version__
from core.config import Settings
from core.errors import ConfigError, CrawlfleetError

FETCHER_VERSION = f"crawlfleet-fetch/{__version__}"
HTTP_LIB_VERSION = f"aiohttp/{version('aiohttp')}"
TLS_LIB_VERSION = ssl.OPENSSL_VERSION
#: Characters of a commit id the code revision keeps (as ``git log --oneline`` shows).
REVISION_CHARS = 12
DIRTY = "+dirty"
#: The tuple's fields in their canonical order, by their key in the string form.
KEYS = ("bundle", "http", "tls", "code")
#: A field's value: printable, no separator, no surrounding blanks, at most 200 characters.
_VALUE = re.compile(r"[^;=\s\x00-\x1f\x7f](?:[^;=\x00-\x1f\x7f]{0,198}[^;=\s\x00-\x1f\x7f])?")


class NotApprovedError(CrawlfleetError):
    """This worker's version tuple is not in the fleet's (non-empty) approved set: its
    session ends (finished work committed, the group left) and it waits, consuming
    nothing, until the tuple is approved."""

    reason = "not_approved"


@dataclass(frozen=True)
class VersionTuple:
    bundle: str
    http: str
    tls: str
    code: str

    def __post_init__(self) -> None:
        for key, value in zip(KEYS, self.fields(), strict=True):
            if not _VALUE.fullmatch(value):
                raise ConfigError(f"version tuple: {key} {value!r} is not a valid value "
                                  "(1-200 printable characters, no ';' or '=', no "
                                  "surrounding blanks)")

    def fields(self) -> tuple[str, str, str, str]:
        return self.bundle, self.http, self.tls, self.code

    def __str__(self) -> str:
        return ";".join(f"{k}={v}" for k, v in zip(KEYS, self.fields(), strict=True))

    @staticmethod
    def parse(text: str) -> VersionTuple:
        """The tuple ``text`` states in the canonical form (all four keys, in order), or
        ConfigError saying what is wrong: an approved set never holds a near miss."""
        parts = text.split(";")
        if len(parts) != len(KEYS):
            raise ConfigError(f"version tuple {text!r}: expected {len(KEYS)} fields "
                              f"({';'.join(k + '=...' for k in KEYS)}), got {len(parts)}")
        values = []
        for key, part in zip(KEYS, parts, strict=True):
            name, eq, value = part.partition("=")
            if name != key or not eq:
                raise ConfigError(f"version tuple {text!r}: expected {key}=... where "
                                  f"{part!r} is")
            values.append(value)
        return VersionTuple(*values)


def git_revision(start: Path) -> str | None:
    """The commit checked out in the git work tree holding ``start`` (first
    :data:`REVISION_CHARS` hex digits), read from ``.git`` directly (HEAD, then the loose
    ref or ``packed-refs``); None outside a checkout or if it cannot be read."""
    for d in (start, *start.parents):
        dot = d / ".git"
        if dot.is_file():  # a worktree or submodule: "gitdir: PATH"
            text = dot.read_text(errors="replace").strip()
            if not text.startswith("gitdir:"):
                return None
            dot = (d / text[len("gitdir:"):].strip()).resolve()
        if dot.is_dir():
            return _head_commit(dot)
    return None


def _head_commit(git_dir: Path) -> str | None:
    try:
        head = (git_dir / "HEAD").read_text().strip()
        if head.startswith("ref:"):
            ref = head[4:].strip()
            common = git_dir
            if (git_dir / "commondir").is_file():  # a linked worktree: refs live there
                common = (git_dir / (git_dir / "commondir").read_text().strip()).resolve()
            loose = common / ref
            if loose.is_file():
                head = loose.read_text().strip()
            else:
                head = ""
                packed = common / "packed-refs"
                for line in packed.read_text().splitlines() if packed.is_file() else ():
                    sha, _, name = line.partition(" ")
                    if name == ref:
                        head = sha
                        break
    except OSError:
        return None
    return head[:REVISION_CHARS] if re.fullmatch(r"[0-9a-f]{40,64}", head) else None


def tree_dirty(work_tree: Path) -> bool:
    """Whether tracked files differ from the checked-out commit (``git status``, without
    the optional index lock: it never writes to the repository). False when git is not
    installed or does not answer within a second: a clean mark is never invented."""
    git = shutil.which("git")
    if git is None:
        return False
    try:
        out = subprocess.run(
            [git, "--no-optional-locks", "-C", str(work_tree), "status", "--porcelain",
             "--untracked-files=no"], capture_output=True, text=True, timeout=1.0,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def built_revision() -> str | None:
    """The revision written into the wheel this package was installed from, or None (a
    checkout, an editable install: no build wrote one)."""
    try:
        module = importlib.import_module("core._build_revision")
    except ImportError:
        return None
    got = getattr(module, "REVISION", None)
    return got if isinstance(got, str) and got else None


@cache
def detected_revision() -> str:
    """This process's code revision: the built one, else the checkout's commit (``+dirty``
    if tracked files differ), else the package version. Read once, at first use."""
    built = built_revision()
    if built is not None:
        return built
    package = Path(__file__).resolve().parent.parent
    commit = git_revision(package)
    if commit is None:
        return __version__
    return commit + (DIRTY if tree_dirty(package) else "")


def code_revision(settings: Settings) -> str:
    """The configured code revision, or (empty: "auto") the detected one."""
    return settings.code_revision or detected_revision()


def worker_tuple(settings: Settings) -> VersionTuple:
    """The version tuple a worker with ``settings`` runs as."""
    return VersionTuple(settings.profile_bundle_version, HTTP_LIB_VERSION, TLS_LIB_VERSION,
                        code_revision(settings))


def refusal(approved: frozenset[str] | set[str], mine: VersionTuple) -> str | None:
    """Why a worker running as ``mine`` must not consume, or None if it may: an empty
    approved set enforces nothing (a new fleet works before anyone approves)."""
    text = str(mine)
    if not approved or text in approved:
        return None
    return (f"version tuple {text} is not in the approved set ({len(approved)} approved); "
            f"approve it with: crawlfleet approve '{text}'")


def version_labels(settings: Settings) -> dict[str, str]:
    """The worker's version tuple, as telemetry reports it."""
    return {"version": __version__, "fetcher_version": FETCHER_VERSION,
            "http_version": HTTP_LIB_VERSION, "tls_version": TLS_LIB_VERSION,
            "profile_bundle_version": settings.profile_bundle_version,
            "code_revision": code_revision(settings)}
