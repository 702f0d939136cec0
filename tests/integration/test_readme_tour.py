"""README's five-minute tour, run as written (issue 44): the commands are parsed from
README's tour block and run in a fresh folder against the real broker and store; each
output's key line is checked, so README cannot drift from the program. The one change: the
demo site's port is the test's own free port."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_helpers import OutputLines

from core.config import Settings

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 120


def tour_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README's tour has no sh block"
    return [ln.strip() for ln in block.group(1).splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]



def test_the_readme_tour_runs_as_written(settings: Settings, site_port: int,
                                         tmp_path: Path) -> None:
    commands = tour_commands()
    assert [c.split()[1] for c in commands] == ["demo-site", "crawl", "crawls", "top",
                                                "pause", "sql", "resume"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")}
    env.update(CRAWLFLEET_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
               PYTHONPATH=str(REPO))  # this checkout's code, from a fresh folder

    def argv(command: str) -> list[str]:
        words = shlex.split(command.rstrip("&").replace("--port 18080",
                                                          f"--port {site_port}"))
        assert words[0] == "crawlfleet"
        return [sys.executable, "-m", "crawlfleet.cli", *words[1:]]

    def run(command: str) -> str:
        out = subprocess.run(argv(command), cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=WAIT_S, check=False)
        assert out.returncode == 0, f"{command}: {out.stdout}{out.stderr}"
        return out.stdout

    site = subprocess.Popen(argv(commands[0]), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    crawl: subprocess.Popen[str] | None = None
    try:
        OutputLines(site.stdout).until(r"^serving ")
        assert (tmp_path / "seeds.txt").read_text().count("http://") == 3
        crawl = subprocess.Popen(argv(commands[1]), cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err = OutputLines(crawl.stderr)
        prefix = err.until(r"^crawl (\S+) started")[1]
        assert f"--topic-prefix {prefix}" in err.until(r"resume it with: .*")[0]
        err.until(r"fetched [1-9]")
        assert re.search(rf"{re.escape(prefix)}.*running", run(commands[2]))
        top = run(commands[3])
        assert re.search(r"\b(?:[1-9]\d*\.\d|0\.[1-9])\b", top), top  # records/s, not all 0.0
        assert "KafkaError{" not in top
        assert f"paused every target of crawl {prefix}" in run(commands[4])
        err.until(r"\| paused")
        assert re.search(r"pages", run(commands[5]))
        assert f"resumed every target of crawl {prefix}" in run(commands[6])
        out, _ = crawl.communicate(timeout=WAIT_S * 2)
        assert crawl.returncode == 0, out + "".join(err.seen)
        assert re.search(r"drained\s*│\s*yes", out), out
    finally:
        for proc in (crawl, site):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
