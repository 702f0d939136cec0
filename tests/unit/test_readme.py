"""README's promises about itself: the layout table is one table over every top folder,
and the set-up section says what a fresh machine downloads."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_layout_table_is_one_table_naming_every_folder() -> None:
    lines = _section("Layout").splitlines()
    rows = [i for i, ln in enumerate(lines) if ln.startswith("|")]
    assert rows == list(range(rows[0], rows[-1] + 1)), "a paragraph splits the table"
    named = {m.group(1) for ln in lines for m in [re.match(r"\| `(\w+)/` \|", ln)] if m}
    root = README.parent
    folders = {p.name for p in root.iterdir() if (p.is_dir() and not p.name.startswith(".")
               and (p / "__init__.py").exists()) or p.name in ("tests", "bench")}
    assert folders <= named, folders - named


def test_the_set_up_section_says_what_the_first_run_downloads() -> None:
    text = " ".join(_section("Two commands").split())
    assert "Maven Central" in text and "downloads" in text
    assert "make bench" in text  # the benchmark's peer is not part of the set-up


def test_make_demo_installs_the_package_alone_without_the_warning_wall() -> None:
    import shutil
    import subprocess
    assert shutil.which("make"), "make runs the two set-up commands"
    plan = subprocess.run(["make", "-n", "-B", "demo"], cwd=README.parent, capture_output=True,
                          text=True, check=True).stdout
    installs = [ln for ln in plan.splitlines() if "pip install" in ln]
    assert installs and all("bench" not in ln and "[dev" not in ln for ln in installs), installs
    assert all('PYTHONWARNINGS="ignore:Editable installation"' in ln for ln in installs)
