"""Listing a prefix's groups waits out a coordinator that is still loading (a broker just
started), and fails at once on any other refusal."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from core.config import Settings
from core.errors import InfraError
from infra import topics


class _Admin:
    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.asked = answers, 0

    def list_consumer_groups(self, request_timeout: float) -> Any:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return SimpleNamespace(result=lambda: answer)


def _listing(errors: list[Any], groups: list[str]) -> Any:
    return SimpleNamespace(errors=errors, valid=[SimpleNamespace(group_id=g) for g in groups])


def test_a_loading_coordinator_is_asked_again() -> None:
    s = Settings(topic_prefix="p.")
    admin = _Admin([_listing([KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)], []),
                    _listing([], ["p.crawlfleet-fetch", "q.crawlfleet-fetch"])])
    assert topics._list_groups(admin, s, 5.0) == ["p.crawlfleet-fetch"]  # type: ignore[arg-type]
    assert admin.asked == 2


def test_other_refusals_and_a_coordinator_loading_too_long_are_errors() -> None:
    s = Settings(topic_prefix="p.")
    denied = _Admin([_listing([KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)], [])])
    with pytest.raises(InfraError, match="cannot list every consumer group"):
        topics._list_groups(denied, s, 5.0)  # type: ignore[arg-type]
    assert denied.asked == 1
    loading = _Admin([_listing([KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)], [])])
    with pytest.raises(InfraError, match="cannot list every consumer group"):
        topics._list_groups(loading, s, 0.5)  # type: ignore[arg-type]
    assert loading.asked >= 2
