"""librdkafka's own log lines: one-shot commands route them to a quiet logger (shown with
``--verbose``); a worker keeps them on its stderr, which is its log file."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from core import config
from core.config import Settings, route_kafka_logs
from crawlfleet.cli import app


@pytest.fixture(autouse=True)
def _unrouted() -> Iterator[None]:
    route_kafka_logs(None)
    log = logging.getLogger("crawlfleet.kafka")
    handlers, propagate = list(log.handlers), log.propagate
    yield
    route_kafka_logs(None)
    log.handlers[:], log.propagate = handlers, propagate


def test_a_routed_process_gives_every_client_the_logger() -> None:
    assert "logger" not in Settings().kafka_common()
    log = logging.getLogger("crawlfleet.kafka")
    route_kafka_logs(log)
    assert Settings().kafka_common()["logger"] is log


def test_a_one_shot_command_routes_and_silences_them() -> None:
    result = CliRunner().invoke(app, ["sql", "--view", "list"])
    assert result.exit_code == 0, result.output
    log = logging.getLogger("crawlfleet.kafka")
    assert config._kafka_logger is log
    assert not log.propagate  # the terminal sees none of them by default


def test_verbose_lets_them_through() -> None:
    result = CliRunner().invoke(app, ["--verbose", "sql", "--view", "list"])
    assert result.exit_code == 0, result.output
    log = logging.getLogger("crawlfleet.kafka")
    assert config._kafka_logger is log and log.propagate


def test_a_worker_keeps_them_on_its_own_stderr() -> None:
    CliRunner().invoke(app, ["worker", "nosuchstage"])
    assert config._kafka_logger is None
