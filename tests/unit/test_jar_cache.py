"""Where the broker's jars live: one cache per user, keyed by the pom, not one per folder
(issue 43: every new folder's first crawl waited for Maven)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from core.errors import InfraError
from infra import kafka_home, kafka_jars, kafka_local
from infra.kafka_home import JARS_ENV

HOME = Path("/home/someone")


def test_the_cache_is_per_user_under_xdg_cache_home_else_dot_cache() -> None:
    digest = kafka_jars.pom_hash(b"<project/>")
    assert kafka_jars.jar_dir_for(digest, {}, HOME) == \
        HOME / ".cache" / "crawlfleet" / "kafka-jars" / digest[:16]
    env = {kafka_jars.CACHE_ENV: "/var/cache/me"}
    assert kafka_jars.jar_dir_for(digest, env, HOME) == \
        Path("/var/cache/me/crawlfleet/kafka-jars") / digest[:16]


def test_a_relative_xdg_cache_home_is_ignored_as_the_spec_says() -> None:
    # Else the cache would again be under whatever folder a command runs from.
    env = {kafka_jars.CACHE_ENV: "relative/cache"}
    assert kafka_jars.jar_cache_root(env, HOME) == HOME / ".cache" / "crawlfleet" / "kafka-jars"


def test_the_key_is_the_poms_content_not_the_folder() -> None:
    one = kafka_jars.pom_hash(b"<kafka>4.1.1</kafka>")
    edited = kafka_jars.pom_hash(b"<kafka>4.2.0</kafka>")
    assert one != edited
    assert kafka_jars.jar_dir_for(one, {}, HOME) != kafka_jars.jar_dir_for(edited, {}, HOME)
    assert kafka_jars.pom_hash(b"<kafka>4.1.1</kafka>") == one


def test_crawlfleet_kafka_jars_overrides_the_cache(tmp_path: Path) -> None:
    env = {JARS_ENV: str(tmp_path / "libs"), kafka_jars.CACHE_ENV: "/var/cache/me"}
    assert kafka_jars.jar_dir_for("ab" * 32, env, HOME) == (tmp_path / "libs").resolve()


def test_a_fresh_cluster_id_has_the_form_kafka_gives_it() -> None:
    ids = {kafka_local._random_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for text in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", text) and not text.startswith("-")
        raw = base64.urlsafe_b64decode(text + "==")
        assert len(raw) == 16 and raw[6] >> 4 == 4  # a version-4 UUID's bytes


def test_a_former_homes_jars_seed_the_cache_without_maven(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JARS_ENV, raising=False)
    monkeypatch.setenv(kafka_jars.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", "")  # no mvn: a resolve would fail loudly
    legacy = tmp_path / "folder" / ".crawlfleet" / "kafka" / "jars"
    legacy.mkdir(parents=True)
    (legacy / "kafka_2.13-4.1.1.jar").write_bytes(b"jar")
    (legacy / ".resolved").write_text(kafka_jars._pom_hash() + "\n")
    got = kafka_jars.ensure_jars(legacy.parent)
    assert got.parent == tmp_path / "cache" / "crawlfleet" / "kafka-jars"
    assert (got / "kafka_2.13-4.1.1.jar").read_bytes() == b"jar"
    assert [p.name for p in got.parent.iterdir() if p.name.endswith(".tmp")] == []
    # Found again from any folder, with no former home at all.
    assert kafka_jars.ensure_jars(tmp_path / "elsewhere") == got


def test_an_override_of_kafka_jars_without_a_marker_is_used_as_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "kafka_2.13-4.1.1.jar").write_bytes(b"jar")
    monkeypatch.setenv(JARS_ENV, str(libs))
    monkeypatch.setenv("PATH", "")
    assert kafka_jars.ensure_jars(tmp_path / "home") == libs.resolve()
    assert sorted(p.name for p in libs.iterdir()) == ["kafka_2.13-4.1.1.jar"]


def test_a_new_homes_port_comes_from_crawlfleet_kafka_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kafka_local.PORT_ENV, raising=False)
    assert kafka_home.default_base_port() == kafka_local.DEFAULT_BASE_PORT
    monkeypatch.setenv(kafka_local.PORT_ENV, "28496")
    assert kafka_home.default_base_port() == 28496
    for bad in ("19o92", "80", "65535"):
        monkeypatch.setenv(kafka_local.PORT_ENV, bad)
        with pytest.raises(InfraError, match=kafka_local.PORT_ENV):
            kafka_home.default_base_port()
