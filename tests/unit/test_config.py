"""Settings: defaults, file, env and overrides; validation; secrets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.config import DEFAULT_PARTITIONS, ENV_PREFIX, Secret, Settings, load_settings
from core.errors import ConfigError
from crawlfleet.crawl import PARTITIONS_PER_WORKER, Plan


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)


def test_defaults_are_valid() -> None:
    s = Settings()
    assert s.rate_cap == 2.0
    assert s.target_mode == "host"
    assert s.scope == "same-target"
    assert s.allow_private is False
    assert s.max_depth == -1
    assert s.rate_caps == {}
    assert s.clickhouse_dsn.get() == ""
    assert s.user_agent.startswith("crawlfleet/")
    assert load_settings() == s


def test_env_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_RATE_CAP", "3.5")
    monkeypatch.setenv("CRAWLFLEET_PARTITIONS", "6")
    monkeypatch.setenv("CRAWLFLEET_ALLOW_PRIVATE", "yes")
    monkeypatch.setenv("CRAWLFLEET_DATA_DIR", "/tmp/cf-data")
    s = load_settings()
    assert s.rate_cap == 3.5
    assert isinstance(s.rate_cap, float)
    assert s.partitions == 6
    assert s.allow_private is True
    assert s.data_dir == Path("/tmp/cf-data")


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("true", True), ("ON", True),
                                            ("0", False), ("false", False), ("no", False),
                                            ("", False)])
def test_bool_env_values(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
    monkeypatch.setenv("CRAWLFLEET_ALLOW_PRIVATE", raw)
    assert load_settings().allow_private is value


def test_override_beats_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_RATE_CAP", "3.5")
    assert load_settings(rate_cap=7.0).rate_cap == 7.0
    assert load_settings(rate_cap=None).rate_cap == 3.5  # None means "flag not given"


def test_toml_file(tmp_path: Path) -> None:
    cfg = tmp_path / "crawl.toml"
    cfg.write_text(
        'rate_cap = 0.5\n'
        'target_mode = "domain"\n'
        'max_depth = 2\n'
        'topic_prefix = "t1."\n'
        'clickhouse_dsn = "http://user:hunter2@ch:8123/db"\n'
        '[rate_caps]\n'
        '"slow.example.com" = 0.1\n'
        '"fast.example.com" = 5\n'
    )
    s = load_settings(cfg)
    assert s.rate_cap == 0.5
    assert s.target_mode == "domain"
    assert s.max_depth == 2
    assert s.topic_prefix == "t1."
    assert s.clickhouse_dsn.get() == "http://user:hunter2@ch:8123/db"
    assert s.rate_caps == {"slow.example.com": 0.1, "fast.example.com": 5.0}
    assert s.cap_for("slow.example.com") == 0.1
    assert s.cap_for("elsewhere.org") == 0.5


def test_precedence_file_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "crawl.toml"
    cfg.write_text("rate_cap = 1.0\nmax_attempts = 9\npartitions = 4\n")
    monkeypatch.setenv("CRAWLFLEET_RATE_CAP", "3.5")
    monkeypatch.setenv("CRAWLFLEET_MAX_ATTEMPTS", "5")
    s = load_settings(cfg, max_attempts=2)
    assert s.partitions == 4  # file only
    assert s.rate_cap == 3.5  # env beats file
    assert s.max_attempts == 2  # override beats env


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "crawl.toml"
    cfg.write_text("max_redirects = 9\n")
    monkeypatch.setenv("CRAWLFLEET_CONFIG", str(cfg))
    assert load_settings().max_redirects == 9


def test_missing_or_broken_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rate_cap = = 1\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(bad)


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"rate_cap": 0}, "rate_cap"),
        ({"rate_cap": -1.0}, "rate_cap"),
        ({"partitions": -1}, "partitions"),
        ({"max_inflight": 0}, "max_inflight"),
        ({"max_uncommitted": 0}, "max_uncommitted"),
        ({"tls_ca_file": "/nonexistent/ca.pem"}, "tls_ca_file"),
        ({"target_mode": "path"}, "target_mode"),
        ({"scope": "everything"}, "scope"),
        ({"max_response_bytes": 10}, "max_response_bytes"),
        ({"max_redirects": -1}, "max_redirects"),
        ({"user_agent": "   "}, "user_agent"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"rate_caps": "a.com=0"}, "rate_caps"),
        ({"partitions": "twelve"}, "partitions"),
        ({"rate_cap": "fast"}, "rate_cap"),
        ({"allow_private": "maybe"}, "allow_private"),
        ({"rate_caps": "a.com"}, "rate_caps"),
        ({"rate_caps": "a.com=quick"}, "rate_caps"),
    ],
)
def test_invalid_values_name_the_setting(overrides: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        load_settings(**overrides)


def test_invalid_env_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_MAX_DEPTH", "deep")
    with pytest.raises(ConfigError, match="max_depth"):
        load_settings()


def test_all_problems_reported_together() -> None:
    with pytest.raises(ConfigError) as exc:
        Settings(rate_cap=0, partitions=-4)
    assert "rate_cap" in str(exc.value)
    assert "partitions" in str(exc.value)


def test_unknown_keys_rejected(tmp_path: Path) -> None:
    cfg = tmp_path / "crawl.toml"
    cfg.write_text("rate_cap = 1.0\nrate_cpa = 2.0\n")
    with pytest.raises(ConfigError, match="rate_cpa"):
        load_settings(cfg)
    with pytest.raises(ConfigError, match="no_such_setting"):
        load_settings(no_such_setting=1)
    with pytest.raises(ConfigError, match="bogus"):
        Settings().replace(bogus=1)


def test_unknown_env_vars_are_named_with_the_likely_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo in a variable's name must not be silently ignored."""
    monkeypatch.setenv("CRAWLFLEET_RATE_CAPP", "2")
    with pytest.raises(ConfigError, match=r"CRAWLFLEET_RATE_CAPP \(did you mean "
                                          r"CRAWLFLEET_RATE_CAP\?\)"):
        load_settings()
    monkeypatch.delenv("CRAWLFLEET_RATE_CAPP")
    for reserved in ("CRAWLFLEET_CONFIG", "CRAWLFLEET_FAULT", "CRAWLFLEET_KAFKA_JARS"):
        monkeypatch.setenv(reserved, "")  # read elsewhere: not settings, not typos
    assert load_settings() == Settings()


def test_a_bad_env_value_names_the_variable_and_the_expected_format(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_RATE_CAP", "fast")
    with pytest.raises(ConfigError, match=r"CRAWLFLEET_RATE_CAP='fast' .*expected a number"):
        load_settings()
    monkeypatch.setenv("CRAWLFLEET_RATE_CAP", "2")
    monkeypatch.setenv("CRAWLFLEET_RATE_CAPS", "a.com:1")
    with pytest.raises(ConfigError, match=r"CRAWLFLEET_RATE_CAPS=.*TARGET=NUMBER pairs"):
        load_settings()
    monkeypatch.delenv("CRAWLFLEET_RATE_CAPS")
    with pytest.raises(ConfigError, match=r"--max-depth='deep'.*whole number"):
        load_settings(max_depth="deep")


def test_replace_coerces_and_validates() -> None:
    s = Settings().replace(rate_cap="4", rate_caps="a.com=1")
    assert s.rate_cap == 4.0
    assert s.rate_caps == {"a.com": 1.0}
    with pytest.raises(ConfigError, match="rate_cap"):
        Settings().replace(rate_cap=-2)


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.rate_cap = 9.0  # type: ignore[misc]


def test_rate_caps_parsed_from_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_RATE_CAPS", " a = 1 , b=2.5,,")
    s = load_settings()
    assert s.rate_caps == {"a": 1.0, "b": 2.5}
    assert s.cap_for("a") == 1.0
    assert s.cap_for("b") == 2.5
    assert s.cap_for("c") == s.rate_cap


def test_rate_caps_override_string() -> None:
    assert load_settings(rate_caps="a=1,b=2").rate_caps == {"a": 1.0, "b": 2.0}


# --- secrets ------------------------------------------------------------------------------

PASSWORD = "hunter2-S3cret"


def test_secret_never_shown() -> None:
    secret = Secret(PASSWORD)
    assert PASSWORD not in repr(secret)
    assert PASSWORD not in str(secret)
    assert PASSWORD not in f"{secret}"
    assert secret.get() == PASSWORD
    assert Secret(PASSWORD) == secret
    assert Secret("other") != secret
    assert repr(Secret("")) == "Secret('')"


def test_settings_repr_hides_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_KAFKA_SASL_PASSWORD", PASSWORD)
    cfg = tmp_path / "crawl.toml"
    cfg.write_text(f'clickhouse_dsn = "http://admin:{PASSWORD}@ch.internal:8123/crawl"\n')
    s = load_settings(cfg, kafka_sasl_mechanism="PLAIN", kafka_sasl_username="bob")
    for text in (repr(s), str(s), f"{s}", f"{s!r}"):
        assert PASSWORD not in text
        assert "bob" in text  # non-secret fields are still shown
    assert s.clickhouse_dsn.get().endswith("@ch.internal:8123/crawl")
    assert s.kafka_common()["sasl.password"] == PASSWORD  # handed to librdkafka only


def test_secret_not_leaked_by_validation_errors() -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(kafka_sasl_password=PASSWORD, rate_cap=-1)
    assert PASSWORD not in str(exc.value)


def test_kafka_common_without_sasl() -> None:
    conf = Settings(bootstrap_servers="b1:9092").kafka_common()
    assert conf == {"bootstrap.servers": "b1:9092"}


def test_partitions_default_to_automatic() -> None:
    s = load_settings()
    assert s.partitions == 0  # automatic: decided where the topics are known
    assert s.topic_partitions == DEFAULT_PARTITIONS
    assert s.replace(partitions=5).topic_partitions == 5


def test_plan_sizes_its_own_topics() -> None:
    assert Plan().partitions() == PARTITIONS_PER_WORKER
    assert Plan(fetch_workers=3).partitions() == 3 * PARTITIONS_PER_WORKER
    assert Plan(fetch_workers=2, parse_workers=5).partitions() == 5 * PARTITIONS_PER_WORKER


def test_dedupe_keys_outlive_the_longest_retry_wait() -> None:
    """Each retry may wait a capped Retry-After (an hour) in the timer store: the dedupe
    keys must outlive every wait before the last attempt, plus the longest lease."""
    from core.config import MAX_RETRY_DELAY_S
    s = Settings(max_attempts=3)
    assert s.retry_horizon_s == 2 * MAX_RETRY_DELAY_S
    with pytest.raises(ConfigError, match="seen_ttl_s"):
        Settings(max_attempts=3, seen_ttl_s=2 * MAX_RETRY_DELAY_S)
    Settings(max_attempts=3, seen_ttl_s=3 * MAX_RETRY_DELAY_S)  # above horizon + lease
