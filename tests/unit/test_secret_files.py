"""Secrets from files (Docker and Kubernetes secrets): ``CRAWLFLEET_<SECRET>_FILE``."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import load_settings
from core.errors import ConfigError


def test_a_secret_is_read_from_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "dsn"
    secret.write_text("http://crawler:s3cret@ch:8123/crawl\n")
    monkeypatch.setenv("CRAWLFLEET_CLICKHOUSE_DSN_FILE", str(secret))
    s = load_settings()
    assert s.clickhouse_dsn.get() == "http://crawler:s3cret@ch:8123/crawl"
    assert "s3cret" not in repr(s)


def test_only_secrets_have_a_file_form_and_a_missing_file_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLFLEET_RATE_CAP_FILE", str(tmp_path / "x"))
    with pytest.raises(ConfigError, match="CRAWLFLEET_RATE_CAP_FILE"):
        load_settings()
    monkeypatch.delenv("CRAWLFLEET_RATE_CAP_FILE")
    monkeypatch.setenv("CRAWLFLEET_KAFKA_SASL_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings()
