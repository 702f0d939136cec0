"""A restore reads a changelog to its *stable* end: the former owner's last transaction,
still open when the restore starts, is in the restored state once it commits, and is not
when it aborts (real broker)."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer

from core.config import Settings
from infra.topics import create_topics, topology_of
from streams.state_store import StateStore

pytestmark = pytest.mark.integration


def _raw(msg: object) -> bytes | None:
    value = msg.value()  # type: ignore[attr-defined]
    return value if isinstance(value, bytes) else None


def _restore_during_open_transaction(settings: Settings, commit: bool) -> tuple[
        dict[bytes, bytes], float]:
    create_topics(settings)
    topic = topology_of(settings).parked
    owner = Producer({**settings.kafka_common(), "transactional.id": f"{topic}-former"})
    owner.init_transactions(30)
    owner.begin_transaction()
    owner.produce(topic, key=b"committed-before", value=b"a", partition=0)
    owner.commit_transaction(30)
    owner.begin_transaction()  # the former owner's last transaction: open at the restore
    owner.produce(topic, key=b"in-last-txn", value=b"b", partition=0)
    owner.produce(topic, key=b"committed-before", value=None, partition=0)
    owner.flush(10)

    def settle() -> None:
        time.sleep(1.5)
        if commit:
            owner.commit_transaction(30)
        else:
            owner.abort_transaction(30)

    settler = threading.Thread(target=settle)
    store = StateStore("parked", settings.data_dir / "restore-test")
    began = time.monotonic()
    settler.start()
    try:
        failed = store.restore(settings, topic, [0], _raw, timeout_s=30)
        took = time.monotonic() - began
        assert failed == set()
        return dict(store.scan(0)), took
    finally:
        settler.join()
        store.close()


def test_restore_waits_for_the_former_owners_open_transaction_to_commit(
        settings: Settings) -> None:
    state, took = _restore_during_open_transaction(settings, commit=True)
    # Read only to the last stable offset, the restore would hold {committed-before: a}
    # and its checkpoint would move past the transaction's writes for good.
    assert state == {b"in-last-txn": b"b"}
    assert took >= 1.0  # it waited for the markers


def test_restore_after_the_former_owners_transaction_aborted(settings: Settings) -> None:
    state, _ = _restore_during_open_transaction(settings, commit=False)
    assert state == {b"committed-before": b"a"}
