"""Suite-wide hooks: which test runs now, for a crash that takes the whole process down.

A C library's abort (librdkafka asserts, e.g. librdkafka#4605) kills pytest before it can
report; ``make test`` then prints the test this file names, with the assertion line above.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Fuzzing: CI runs the same examples every time ("ci": derandomized, no example database);
# HYPOTHESIS_PROFILE=nightly explores new inputs (HYPOTHESIS_MAX_EXAMPLES per test, 100,000
# unless set) and keeps what it finds in .hypothesis/, so a failure found once is tried
# first on the next run.
settings.register_profile("ci", max_examples=300, deadline=None, derandomize=True,
                          database=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly",
                          max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", 100_000)),
                          deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Where the nodeid of the running test is kept (``make test`` reads it after a crash).
CURRENT = Path(os.environ.get("CRAWLFLEET_CURRENT_TEST", ".crawlfleet/current-test"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    CURRENT.parent.mkdir(parents=True, exist_ok=True)
    CURRENT.write_text(nodeid + "\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    CURRENT.unlink(missing_ok=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Unit tests first (a thousand in about two minutes), then the integration tests on the
    real broker (each takes seconds): the progress moves from the start, and a broken rule
    shows before the long part. Stable otherwise: files keep their order."""
    items.sort(key=lambda item: "integration" in item.keywords)


@pytest.fixture(autouse=True)
def _kafka_logs_unrouted() -> Iterator[None]:
    """A CLI command run in-process routes librdkafka's lines for the whole process
    (``route_kafka_logs``): undo it, so each test's clients log as a worker's do."""
    yield
    from core.config import route_kafka_logs
    route_kafka_logs(None)
