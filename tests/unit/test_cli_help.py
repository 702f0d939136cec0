"""Every command's help as a newcomer reads it: each option says its default, each option
that a setting backs names its environment variable, and nothing renders half-formatted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.core import TyperOption
from typer.testing import CliRunner

from core.config import SETTING_DEFAULTS
from crawlfleet.cli import app

#: CLI option names that differ from the setting they set.
ALIASES = {"bootstrap": "bootstrap_servers", "clickhouse": "clickhouse_dsn",
           "profile": "default_profile"}


def _commands() -> Iterator[tuple[list[str], Any]]:
    root = typer.main.get_command(app)

    def walk(path: list[str], cmd: Any) -> Iterator[tuple[list[str], Any]]:
        if hasattr(cmd, "commands"):  # a group (typer's own click)
            for name, sub in cmd.commands.items():
                yield from walk([*path, name], sub)
        else:
            yield path, cmd

    yield from walk([], root)


COMMANDS = list(_commands())


def test_every_command_is_covered() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"crawl", "publish", "worker", "top", "sql", "kafka up", "topics create",
            "dlq replay", "doctor", "demo", "pause", "cap"} <= names


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_each_option_says_its_default_and_its_variable(path: list[str],
                                                       cmd: Any) -> None:
    ctx = typer.Context(cmd, info_name=path[-1])
    for param in cmd.params:
        if not isinstance(param, TyperOption) or param.name == "help":
            continue
        record = param.get_help_record(ctx)
        assert record is not None, param.name
        opts, text = record
        assert text.strip(), f"{' '.join(path)} {opts}: no description"
        if param.required:
            assert "required" in text, f"{' '.join(path)} {opts}: {text!r}"
            continue
        assert "default" in text, f"{' '.join(path)} {opts}: no default shown: {text!r}"
        setting = ALIASES.get(str(param.name), str(param.name))
        if param.default is None and setting in SETTING_DEFAULTS:
            assert f"CRAWLFLEET_{setting.upper()}" in text, \
                f"{' '.join(path)} {opts}: left out, it takes setting {setting}: {text!r}"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) for p, _ in COMMANDS])
def test_the_help_text_renders_whole(path: list[str]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "{" not in out.split("\n\n")[0], out  # usage: SEEDS, not {seeds}
    assert "<bool>" not in out
    assert not re.search(r"\w \.(\s|$)", out), out  # "servers ." : markup eaten by the renderer
    usage = out.splitlines()[0]
    for word in re.findall(r"\b[a-z_]+\b", usage.split("[OPTIONS]")[-1]):
        assert word in ("", "..."), f"argument shown lower-case: {usage}"


def test_the_rate_cap_default_matches_the_setting_and_readme() -> None:
    result = CliRunner().invoke(app, ["crawl", "--help"], env={"COLUMNS": "200"})
    assert f"default: {SETTING_DEFAULTS['rate_cap']}; env CRAWLFLEET_RATE_CAP" in \
        " ".join(result.output.split())
    assert SETTING_DEFAULTS["rate_cap"] == 2.0


def test_help_shows_each_default_once_and_no_python_types_or_cut_descriptions() -> None:
    """Issue 44: `chaos --help` said "[default: 0, no soak] [default: 0.0]", `approve`'s
    usage read "[[TUPLE]...]..." with a type "<list[str]>", and the command list cut
    descriptions short with "..."."""
    runner = CliRunner()
    chaos = runner.invoke(app, ["chaos", "--help"], terminal_width=200).output
    assert "[default: 0, no soak]" in chaos and "no soak] [default: 0.0]" not in chaos
    for path, cmd in COMMANDS:  # one default per option, however it is shown
        ctx = typer.Context(cmd, info_name=path[-1])
        for param in cmd.params:
            record = param.get_help_record(ctx)
            assert record is None or record[1].count("[default:") <= 1, (path, record)
    approve = runner.invoke(app, ["approve", "--help"], terminal_width=200).output
    assert "[TUPLE]..." in approve and "[[TUPLE]" not in approve
    assert "list[str]" not in approve
    top = runner.invoke(app, ["--help"], terminal_width=200).output
    assert "..." not in top.split("Commands:")[1]
    assert "crawls" in top  # the crawls on the broker: listed, removed


def test_make_help_lists_every_target() -> None:
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["make", "-s", "help"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    for target in ("demo", "test", "lint", "bench", "soak", "clean-cache"):
        assert f"make {target} " in out, out


def test_every_variable_a_help_text_names_besides_settings_is_in_readme() -> None:
    """Issue 44: `kafka --dir` named $CRAWLFLEET_HOME, which README never mentioned. (A
    setting's variable is README's ``CRAWLFLEET_<SETTING>``.)"""
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    named: set[str] = set()
    for path, cmd in COMMANDS:
        ctx = typer.Context(cmd, info_name=path[-1])
        for param in cmd.params:
            record = param.get_help_record(ctx)
            named |= set(re.findall(r"CRAWLFLEET_[A-Z_]+", record[1] if record else ""))
    assert "CRAWLFLEET_HOME" in named
    settings = {f"CRAWLFLEET_{k.upper()}" for k in SETTING_DEFAULTS}
    assert sorted(v for v in named - settings if v not in readme) == []
