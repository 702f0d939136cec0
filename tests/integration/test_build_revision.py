"""A built wheel carries the commit it was built from (issue 41, point 4).

Before this, every ``pip install .`` of one version read ``code=0.1.0``: two builds looked
alike in every record, view and approved set. The test builds real wheels (pip, setuptools,
the tree's own backend), installs them by unpacking outside any checkout, and reads the
revision back the way a worker does, and the way an operator does (``--version``). The
expected value comes from ``git`` itself, not from the code under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _expected() -> str:
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return _git("rev-parse", "HEAD")[:12] + ("+dirty" if dirty else "")


def _wheel(out: Path, env: dict[str, str] | None = None) -> Path:
    made_build_dir = not (REPO / "build").exists()  # pip builds in the tree: build/lib
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                        str(out), str(REPO)], check=True, env={**os.environ, **(env or {})},
                       cwd=out, timeout=300)
    finally:
        if made_build_dir:
            shutil.rmtree(REPO / "build", ignore_errors=True)
    (wheel,) = out.glob("crawlfleet-*.whl")
    return wheel


def _installed(wheel: Path, where: Path) -> Path:
    site = where / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def _run(site: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          check=True, env=env, cwd=site.parent, timeout=120).stdout.strip()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("wheel")
    return _installed(_wheel(where), where)


def test_wheel_records_the_commit_it_was_built_from(built: Path) -> None:
    text = (built / "core" / "_build_revision.py").read_text()
    assert f"REVISION = {_expected()!r}" in text
    assert not (built / "buildsupport").exists()  # the build's helper is not shipped
    assert not (REPO / "core" / "_build_revision.py").exists()  # nor written into the tree


def test_installed_package_reports_the_built_revision(built: Path) -> None:
    where = _run(built, "-c", "import core; print(core.__file__)")
    assert where.startswith(str(built))  # the unpacked wheel, not the checkout
    got = _run(built, "-c", "from core.config import Settings; "
               "from core.versions import worker_tuple; print(worker_tuple(Settings()).code)")
    assert got == _expected()
    assert got != "0.1.0"
    shown = _run(built, "-m", "crawlfleet.cli", "--version")
    assert f"code {_expected()}" in shown


def test_build_revision_can_be_given_where_the_tree_has_no_git(tmp_path: Path) -> None:
    site = _installed(_wheel(tmp_path, {"CRAWLFLEET_BUILD_REVISION": "image-build-7"}),
                      tmp_path)
    got = _run(site, "-c", "from core.versions import detected_revision; "
               "print(detected_revision())")
    assert got == "image-build-7"


def test_installed_plan_reads_the_costs_the_wheel_carries(built: Path) -> None:
    """Issue 42 point 4: ``crawlfleet plan`` from an installed package, no checkout beside
    it (before, the costs file was looked up next to the source tree and the command failed)."""
    import json

    where = _run(built, "-c", "from crawlfleet.plan import COSTS; print(COSTS)")
    assert where.startswith(str(built)) and (built / "infra" / "costs.json").is_file()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env |= {"PYTHONPATH": str(built), "COLUMNS": "400"}
    out = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "plan", "--pages-per-day",
                          "1e9", "--targets", "10000000"], capture_output=True, text=True,
                         env=env, cwd=built.parent, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    measured = json.loads((REPO / "infra" / "costs.json").read_text())["measured"]
    assert "11,574" in out.stdout and measured["commit"] in out.stdout
    assert "binds first" in out.stdout and "margin of the others" in out.stdout
