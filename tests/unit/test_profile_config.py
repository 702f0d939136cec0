"""Crawl profiles and egresses from configuration (core.profiles through Settings): the TOML
tables and their JSON environment form, every refusal at load, and ``crawlfleet profiles``,
which lists them without ever printing a proxy's secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from core.config import load_settings
from core.errors import ConfigError, FatalError
from core.profiles import UnknownProfileError, redact_url, unknown_profile
from crawlfleet.cli import app

UA = "examplebot/2.1 (+https://example.org/bot)"
SECRET = "s3cret-Pa55"
TOML = f"""
region = "eu"
default_profile = "research"

[profiles.research]
user_agent = "{UA}"
headers = {{From = "crawl@example.org"}}
region = "eu"
egress = ["eu-proxy-1", "direct"]
cookies = true
bundle_version = "3"

[profiles.shop]
user_agent = "shopbot/1.0 (mailto:ops@example.org)"
robots_token = "shopbot-eu"
region = "eu"
egress = ["eu-proxy-1"]
targets = ["shop.example", "cart.example"]

[egress.eu-proxy-1]
proxy = "http://crawler:{SECRET}@10.0.0.5:3128"
region = "eu"
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    for key in list(os.environ):
        if key.startswith("CRAWLFLEET_"):
            monkeypatch.delenv(key)


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "crawlfleet.toml"
    path.write_text(text)
    return path


def test_toml_profiles_and_egress_load(tmp_path: Path) -> None:
    s = load_settings(_config(tmp_path, TOML))
    assert sorted(s.profile_table) == ["research", "shop"]
    research, shop = s.profile_table["research"], s.profile_table["shop"]
    assert research.user_agent == UA
    assert research.robots_token == "examplebot"  # the UA's product token by default
    assert research.region == "eu"
    assert research.egress == ("eu-proxy-1", "direct")
    assert research.cookies is True and shop.cookies is False
    assert research.bundle_version == "3" and shop.bundle_version == "1"
    assert research.request_headers() == {"User-Agent": UA, "From": "crawl@example.org"}
    assert shop.robots_token == "shopbot-eu"
    assert shop.allowed_for("shop.example") and not shop.allowed_for("other.example")
    assert research.allowed_for("other.example")  # no targets: every target
    assert sorted(s.egress_table) == ["direct", "eu-proxy-1"]
    assert s.egress_table["direct"].region == "eu" and s.egress_table["direct"].direct
    assert s.egress_table["eu-proxy-1"].proxy == f"http://crawler:{SECRET}@10.0.0.5:3128"


def test_env_json_form_loads_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_REGION", "us")
    monkeypatch.setenv("CRAWLFLEET_DEFAULT_PROFILE", "a")
    monkeypatch.setenv("CRAWLFLEET_EGRESS", json.dumps(
        {"us-1": {"proxy": "http://10.0.0.6:3128", "region": "us"}}))
    monkeypatch.setenv("CRAWLFLEET_PROFILES", json.dumps(
        {"a": {"user_agent": UA, "region": "us", "egress": ["us-1", "direct"]},
         "b": {"user_agent": UA, "region": "us"}}))
    s = load_settings()
    assert s.profile_table["a"].egress == ("us-1", "direct")
    assert s.profile_table["b"].egress == ("direct",)  # no pool given: direct
    assert s.egress_table["us-1"].region == "us"
    assert s.egress_table["direct"].region == "us"


def test_bad_json_in_env_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_PROFILES", "{not json")
    with pytest.raises(ConfigError, match="profiles"):
        load_settings()


def test_no_profiles_configured_gives_the_implicit_default() -> None:
    s = load_settings(None, user_agent=UA, robots_agent="examplebot-x", default_profile="main")
    assert list(s.profile_table) == ["main"]
    main = s.profile_table["main"]
    assert main.user_agent == UA and main.robots_token == "examplebot-x"
    assert main.egress == ("direct",)


def _refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, text))
    return str(info.value)


def test_a_profile_paired_with_an_egress_of_another_region_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, TOML.replace('10.0.0.5:3128"\nregion = "eu"',
                                              '10.0.0.5:3128"\nregion = "us"'))
    assert "profiles['research']" in message
    assert "'eu-proxy-1'" in message and "'us'" in message and "'eu'" in message
    assert "never leaves its region" in message


def test_the_direct_egress_has_the_region_setting(tmp_path: Path) -> None:
    # direct is in region "local" unless told: an "eu" profile may not use it.
    message = _refused(tmp_path, f'[profiles.p]\nuser_agent = "{UA}"\nregion = "eu"\n')
    assert "'direct'" in message and "'local'" in message


@pytest.mark.parametrize("ua", [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (+https://example.org)",
    "mozilla/5.0 (compatible; examplebot/1.0; +https://example.org/bot)",
])
def test_a_browser_like_user_agent_is_refused(tmp_path: Path, ua: str) -> None:
    message = _refused(tmp_path, f'[profiles.p]\nuser_agent = "{ua}"\nregion = "local"\n')
    assert "profiles['p']" in message and "browser" in message


@pytest.mark.parametrize("ua", ["examplebot/1.0", "examplebot/1.0 (polite crawler)"])
def test_a_user_agent_without_contact_is_refused(tmp_path: Path, ua: str) -> None:
    message = _refused(tmp_path, f'[profiles.p]\nuser_agent = "{ua}"\nregion = "local"\n')
    assert "no contact" in message


@pytest.mark.parametrize("header", ["User-Agent", "cookie", "Host", "Proxy-Authorization"])
def test_reserved_headers_are_refused(tmp_path: Path, header: str) -> None:
    message = _refused(tmp_path, f'[profiles.p]\nuser_agent = "{UA}"\nregion = "local"\n'
                                 f'headers = {{"{header}" = "x"}}\n')
    assert "headers may not set" in message and header in message


def test_an_unknown_egress_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, f'[profiles.p]\nuser_agent = "{UA}"\nregion = "local"\n'
                                 'egress = ["nowhere"]\n')
    assert "unknown egress 'nowhere'" in message and "direct" in message


def test_default_profile_must_be_among_the_profiles(tmp_path: Path) -> None:
    message = _refused(tmp_path, TOML.replace('default_profile = "research"',
                                              'default_profile = "missing"'))
    assert "default_profile 'missing'" in message and "research" in message


@pytest.mark.parametrize(("name", "spec"), [
    ("direct", {"proxy": "http://10.0.0.5:3128", "region": "local"}),
    ("p", {"proxy": "socks5://10.0.0.5:1080", "region": "local"}),
    ("p", {"proxy": "http://10.0.0.5:3128"}),
    ("p", {"proxy": "http://10.0.0.5:31x8", "region": "local"}),
    ("p", {"proxy": "http://10.0.0.5:3128", "region": "local", "password": "x"}),
])
def test_bad_egress_tables_are_refused(monkeypatch: pytest.MonkeyPatch, name: str,
                                       spec: dict[str, Any]) -> None:
    monkeypatch.setenv("CRAWLFLEET_EGRESS", json.dumps({name: spec}))
    with pytest.raises(ConfigError, match=f"egress\\['{name}'\\]"):
        load_settings()


def test_redaction_hides_passwords_and_bare_tokens() -> None:
    assert redact_url(f"http://u:{SECRET}@h:3128/") == "http://u:***@h:3128/"
    assert redact_url(f"http://{SECRET}@h:3128") == "http://***@h:3128"
    assert redact_url("http://h:3128") == "http://h:3128"
    s = load_settings(None, region="eu", egress={"e": {
        "proxy": f"http://u:{SECRET}@10.0.0.5:3128", "region": "eu"}})
    assert SECRET not in repr(s.egress_table["e"]) and SECRET not in repr(s)


def test_a_bad_port_is_refused_without_showing_the_password(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_EGRESS", json.dumps(
        {"p": {"proxy": f"http://u:{SECRET}@10.0.0.5:31x8", "region": "local"}}))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "bad port" in str(info.value) and SECRET not in str(info.value)


def test_unknown_profile_error_is_fatal_with_its_reason() -> None:
    table = load_settings(None, user_agent=UA).profile_table
    assert unknown_profile("default", table) is None
    exc = unknown_profile("ghost", table)
    assert isinstance(exc, UnknownProfileError) and isinstance(exc, FatalError)
    assert exc.reason == "unknown_profile" and not exc.retryable
    assert "'ghost'" in str(exc) and "default" in str(exc)


# --- crawlfleet profiles -------------------------------------------------------------------


def test_profiles_command_lists_everything_and_no_secret(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["profiles", "--config", str(_config(tmp_path, TOML))],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert SECRET not in out
    assert "http://crawler:***@10.0.0.5:3128" in out
    for expected in ("research", "shop", UA, "shopbot-eu", "examplebot", "on", "off",
                     "shop.example, cart.example", "eu-proxy-1 (eu: http://crawler:***@",
                     "direct (eu: direct)", "From", "default research"):
        assert expected in out, expected
    # the egress table: each egress with its region and the profiles using it
    lines = [ln for ln in out.splitlines() if "eu-proxy-1" in ln and "research, shop" in ln]
    assert lines, out


def test_profiles_command_shows_the_implicit_default(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(app, ["profiles"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "implicit" in result.output and "crawlfleet/" in result.output


def test_profiles_command_refuses_a_bad_configuration(tmp_path: Path) -> None:
    bad = TOML.replace('egress = ["eu-proxy-1"]\n', 'egress = ["nowhere"]\n')
    result = CliRunner().invoke(app, ["profiles", "--config", str(_config(tmp_path, bad))])
    assert result.exit_code != 0
    assert "unknown egress 'nowhere'" in result.output
    assert SECRET not in result.output
