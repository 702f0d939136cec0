"""Fixtures shared by unit tests of more than one module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.fetch.parking import ParkedQueues
from core.config import Settings, load_settings
from streams.state_store import StateStore

#: Partitions of the parked-job store the parking tests open (``partition_for(t, PARKED_PARTS)``).
PARKED_PARTS = 4


@pytest.fixture
def parked_queues() -> Iterator[ParkedQueues]:
    """Parked queues over an in-memory state store with every partition open."""
    store = StateStore("parked")
    for p in range(PARKED_PARTS):
        store.open(p)
    yield ParkedQueues(store, PARKED_PARTS)
    store.close()


@pytest.fixture
def embedded_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a user gets with no config and no ``CRAWLFLEET_*`` environment: the embedded
    store, its data dir in this test's ``tmp_path/data``."""
    for key in [k for k in os.environ if k.startswith("CRAWLFLEET_")]:
        monkeypatch.delenv(key)
    return load_settings(data_dir=tmp_path / "data")


#: page_visits as stores made it before issue 44 (keyed by page and visit only, no crawl) and
#: issue 45.3 (no next_due_at): the migration tests start from it.
OLD_PAGE_VISITS = """CREATE TABLE page_visits (
    dedupe_key String, visit UInt32, url String, target LowCardinality(String),
    profile LowCardinality(String), visited_at DateTime64(3, 'UTC'), status UInt16,
    outcome LowCardinality(String), changed UInt8, signature String, etag String,
    last_modified String, stored_at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(visited_at) ORDER BY (dedupe_key, visit)"""
