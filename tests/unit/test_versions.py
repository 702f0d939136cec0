"""The version tuple: its one string form parsed back strictly, the code revision read from
a checkout's .git (compared with git's own answer), and the approval decision."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from core.config import load_settings
from core.errors import ConfigError
from core.versions import (
    DIRTY,
    HTTP_LIB_VERSION,
    TLS_LIB_VERSION,
    VersionTuple,
    code_revision,
    detected_revision,
    git_revision,
    refusal,
    worker_tuple,
)

REPO = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"
A = VersionTuple("1", "aiohttp/3.14.5", "OpenSSL 3.0.13 30 Jan 2024", "1a2b3c4d5e6f")


def test_the_string_form_round_trips() -> None:
    text = "bundle=1;http=aiohttp/3.14.5;tls=OpenSSL 3.0.13 30 Jan 2024;code=1a2b3c4d5e6f"
    assert str(A) == text
    assert VersionTuple.parse(text) == A
    other = VersionTuple("2024-06", "aiohttp/4.0", "LibreSSL 3.9", "0.1.0")
    assert VersionTuple.parse(str(other)) == other


@pytest.mark.parametrize("text", [
    "",
    "bundle=1;http=a;tls=b",  # a field missing
    "bundle=1;http=a;tls=b;code=c;extra=d",
    "http=a;bundle=1;tls=b;code=c",  # out of order
    "bundle=1;http=a;tls=b;code=",  # empty value
    "bundle=1;http=a;tls=b;code= c",  # surrounding blank
    "bundle=1;http=a;tls=b;code=c ",
    "bundle=1;http=a;tls=b;code=c=d",  # a separator in a value
    "Bundle=1;http=a;tls=b;code=c",
    "bundle:1;http=a;tls=b;code=c",
    "bundle=1;http=a;tls=b\n;code=c",
])
def test_a_near_miss_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="version tuple"):
        VersionTuple.parse(text)


def test_a_separator_cannot_be_configured_into_a_field() -> None:
    with pytest.raises(ConfigError, match="code_revision"):
        load_settings(code_revision="abc;def")
    with pytest.raises(ConfigError, match="profile_bundle_version"):
        load_settings(profile_bundle_version="v=2")


def _git_dir(root: Path, head: str) -> Path:
    (root / ".git" / "refs" / "heads").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text(head)
    pkg = root / "src" / "pkg"
    pkg.mkdir(parents=True)
    return pkg


def test_revision_from_a_loose_ref(tmp_path: Path) -> None:
    pkg = _git_dir(tmp_path, "ref: refs/heads/main\n")
    (tmp_path / ".git" / "refs" / "heads" / "main").write_text(SHA + "\n")
    assert git_revision(pkg) == SHA[:12]


def test_revision_from_packed_refs_and_a_detached_head(tmp_path: Path) -> None:
    pkg = _git_dir(tmp_path, "ref: refs/heads/topic\n")
    (tmp_path / ".git" / "packed-refs").write_text(
        "# pack-refs with: peeled fully-peeled sorted\n"
        f"{'f' * 40} refs/heads/other\n{SHA} refs/heads/topic\n")
    assert git_revision(pkg) == SHA[:12]
    (tmp_path / ".git" / "HEAD").write_text("fedcba9876543210fedcba9876543210fedcba98\n")
    assert git_revision(pkg) == "fedcba987654"


def test_revision_through_a_gitdir_file_and_none_outside_a_checkout(tmp_path: Path) -> None:
    real = tmp_path / "store"
    pkg = _git_dir(real, "ref: refs/heads/main\n")
    (real / ".git" / "refs" / "heads" / "main").write_text(SHA)
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / ".git").write_text(f"gitdir: {real / '.git'}\n")
    assert git_revision(tree / "pkg") == SHA[:12]
    assert git_revision(pkg) == SHA[:12]
    # an unborn branch (no commit yet) and a corrupt HEAD name no revision
    (real / ".git" / "refs" / "heads" / "main").unlink()
    assert git_revision(pkg) is None
    (real / ".git" / "HEAD").write_text("garbage")
    assert git_revision(pkg) is None


def test_this_checkout_reports_the_commit_git_names() -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO), "status",
                            "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert git_revision(REPO / "core") == head[:12]
    # The tree may change between the two looks while people edit it: compare the commit.
    assert detected_revision().removesuffix(DIRTY) == head[:12]
    if not dirty:
        assert not detected_revision().endswith(DIRTY)


def test_a_configured_revision_overrides_the_detected_one() -> None:
    assert code_revision(load_settings(code_revision="build-7")) == "build-7"
    assert code_revision(load_settings()) == detected_revision()
    mine = worker_tuple(load_settings(code_revision="build-7", profile_bundle_version="9"))
    assert mine == VersionTuple("9", HTTP_LIB_VERSION, TLS_LIB_VERSION, "build-7")


def test_an_empty_set_enforces_nothing_and_a_full_one_admits_only_its_tuples() -> None:
    b = VersionTuple(A.bundle, A.http, A.tls, "ffffffffffff")
    assert refusal(set(), A) is None  # a new fleet works before anyone approves
    assert refusal({str(A)}, A) is None
    assert refusal({str(A), str(b)}, b) is None
    why = refusal({str(A)}, b)
    assert why is not None
    assert str(b) in why and f"crawlfleet approve '{b}'" in why
    # a tuple differing in one field only is another version
    assert refusal({str(A)}, VersionTuple("2", A.http, A.tls, A.code)) is not None
