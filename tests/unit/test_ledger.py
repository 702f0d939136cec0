"""The fetch ledger: epochs, holders, and what each transaction may commit."""

from __future__ import annotations

from typing import Any

from streams.io import Output
from streams.ledger import Ledger, Pending

TP = ("crawl.frontier", 0)
HIGH = ("crawl.frontier.high", 0)
NONE_SEEN: Any = lambda _p, _k: None  # noqa: E731


def _job(url: str = "http://a/") -> dict[str, Any]:
    return {"url": url, "target": "a", "profile": "default", "attempt": 0}


def _out(n: int) -> Output:
    return Output("crawl.fetched", 0, f"k{n}".encode(), b"v", [])


def _admit(ledger: Ledger, offset: int, url: str = "http://a/") -> Pending:
    epoch = ledger.admit(TP, offset)
    assert epoch is not None
    pj = Pending(TP, offset, epoch, _job(url), f"default|{url}")
    ledger.hold(pj)
    return pj


def test_commits_only_below_the_oldest_unfinished_record() -> None:
    led = Ledger()
    led.assign([TP])
    a, b = _admit(led, 0, "http://a/1"), _admit(led, 1, "http://a/2")
    assert led.finish(b, [_out(1)], ("DONE", 0))
    batch = led.take_commit({})
    assert batch is not None and batch.offsets == {TP: 0}  # a still pins offset 0
    assert [o.key for o in batch.outputs] == [b"k1"]
    led.committed(batch)
    assert led.finish(a, [_out(0)], ("DONE", 0))
    batch = led.take_commit({})
    assert batch is not None and batch.offsets == {TP: 2}


def test_work_of_a_revoked_partition_is_dropped() -> None:
    led = Ledger()
    led.assign([TP])
    pj = _admit(led, 0)
    led.revoke([TP])
    assert not led.finish(pj, [_out(0)], ("DONE", 0))
    led.forget([TP])
    assert led.take_commit({}) is None  # nothing of ours to commit


def test_a_holder_of_an_older_epoch_does_not_hide_the_redelivered_copy() -> None:
    led = Ledger()
    led.assign([TP])
    first = _admit(led, 0)
    again = Pending(TP, 1, first.epoch, first.job, first.key)
    assert led.is_duplicate(again, NONE_SEEN)  # same key while the first is in flight
    led.revoke([TP])
    led.assign([TP])
    redelivered = Pending(TP, 0, led.epochs[TP], first.job, first.key)
    assert not led.is_duplicate(redelivered, NONE_SEEN)


def test_only_the_holder_releases_its_key() -> None:
    led = Ledger()
    led.assign([TP])
    holder = _admit(led, 0)
    repeat = Pending(TP, 1, holder.epoch, holder.job, holder.key)
    led.release(repeat)
    assert led.is_duplicate(repeat, NONE_SEEN)
    led.release(holder)
    assert not led.is_duplicate(repeat, NONE_SEEN)


def test_pending_dedupe_state_counts_before_and_during_the_commit() -> None:
    led = Ledger()
    led.assign([TP])
    pj = _admit(led, 0)
    led.finish(pj, [_out(0)], ("DONE", 0))
    later = Pending(TP, 5, pj.epoch, pj.job, pj.key)
    assert led.is_duplicate(later, NONE_SEEN)  # pending
    batch = led.take_commit({})
    assert batch is not None and batch.seen == {(0, pj.key): ("DONE", 0)}
    assert led.is_duplicate(later, NONE_SEEN)  # committing
    led.aborted()
    assert not led.is_duplicate(later, NONE_SEEN)  # never committed: not seen


def test_a_retry_of_the_same_attempt_is_not_a_duplicate() -> None:
    led = Ledger()
    led.assign([TP])
    pj = Pending(TP, 0, 1, {**_job(), "attempt": 1}, "default|http://a/")
    assert not led.is_duplicate(pj, lambda _p, _k: ("RETRYING", 1))
    assert led.is_duplicate(pj, lambda _p, _k: ("RETRYING", 2))
    assert led.is_duplicate(pj, lambda _p, _k: ("DONE", 0))


def test_outputs_carry_every_owned_offset_for_fencing() -> None:
    led = Ledger()
    other = ("crawl.frontier", 1)
    led.assign([TP, other])
    _admit(led, 0)
    led.take_commit({other: 7})  # idle partition advanced to its position
    pj = _admit(led, 1)
    led.finish(pj, [_out(1)], None)
    batch = led.take_commit({})
    assert batch is not None and set(batch.offsets) == {TP, other}


def test_parked_jobs_do_not_touch_offsets_but_carry_their_store_change() -> None:
    led = Ledger()
    led.assign([TP])
    led.take_commit({TP: 3})
    batch = led.take_commit({TP: 3})
    pj = Pending(TP, -1, led.epochs[TP], _job(), "default|http://a/", park_key=b"a\x00\x01k")
    assert led.finish(pj, [_out(9)], ("DONE", 0), [(0, b"a\x00\x01k", None)])
    batch = led.take_commit({})
    assert batch is not None
    assert batch.changes == [(0, b"a\x00\x01k", None)]
    assert batch.offsets == {TP: 3}


def test_a_skipped_repeat_from_disk_does_not_release_the_holder() -> None:
    """Jobs taken back from the parked store all have offset -1: their park keys tell
    them apart, or a skipped copy would free the key while the first is in flight."""
    led = Ledger()
    led.assign([TP])
    epoch = led.epochs[TP]
    first = Pending(TP, -1, epoch, _job(), "default|http://a/", park_key=b"a\x00\x01" + bytes(8))
    led.hold(first)
    repeat = Pending(TP, -1, epoch, _job(), "default|http://a/",
                     park_key=b"a\x00\x01" + b"\x01" * 8)
    assert led.is_duplicate(repeat, NONE_SEEN)
    led.finish(repeat, [], None)  # skipped: its entry goes, the holder stays
    third = Pending(TP, 9, epoch, _job(), "default|http://a/")
    assert led.is_duplicate(third, NONE_SEEN)


def test_a_worker_restarted_with_only_parked_work_commits_its_results() -> None:
    """After a restart the partition's committed offset is all a worker knows of it (no
    frontier record consumed yet): its parked jobs' results commit with that offset."""
    led = Ledger()
    led.assign([TP], {TP: 40})
    pj = Pending(TP, -1, led.epochs[TP], _job(), "default|http://a/", park_key=b"a\x00\x01k")
    assert led.finish(pj, [_out(1)], ("DONE", 0), [(0, b"a\x00\x01k", None)])
    assert led.uncommitted == 1
    batch = led.take_commit({})
    assert batch is not None
    assert [o.key for o in batch.outputs] == [b"k1"]
    assert batch.offsets == {TP: 40}
    assert batch.changes == [(0, b"a\x00\x01k", None)]
    assert batch.seen == {(0, pj.key): ("DONE", 0)}
    assert led.uncommitted == 1  # being committed
    led.committed(batch)
    assert led.uncommitted == 0


def test_results_of_a_partition_never_committed_nor_read_commit_at_its_start() -> None:
    """A partition the group never committed, of which this worker has read nothing (its
    target's records all came on the other tier, then were parked): its results commit
    with offset 0, where the group reads it from anyway. They used to wait for a position
    that only a new record would give, and a worker with nothing more to read stood still
    holding them (uncommitted, queue empty, lag never reaching 0)."""
    led = Ledger()
    led.assign([TP, HIGH])  # neither tier has a committed offset
    pj = Pending(TP, -1, led.epochs[TP], _job(), "default|http://a/", park_key=b"a\x00\x01k")
    assert led.finish(pj, [_out(1)], ("DONE", 0))
    batch = led.take_commit({})
    assert batch is not None and batch.offsets == {TP: 0, HIGH: 0}
    assert [o.key for o in batch.outputs] == [b"k1"] and batch.jobs == 1
    led.committed(batch)
    assert led.completed == 0 and led.uncommitted == 0
    # Nothing new since: no offsets to send, no empty transaction.
    assert led.take_commit({}) is None


def test_nothing_is_committed_after_a_failed_commit() -> None:
    """The revoke callback and a clean stop commit again after an abort: they must not
    carry offsets past the aborted batch (its parked jobs and results would be lost)."""
    led = Ledger()
    led.assign([TP], {TP: 0})
    a = _admit(led, 0, "http://a/1")
    led.finish(a, [_out(0)], ("DONE", 0))
    batch = led.take_commit({TP: 1})
    assert batch is not None and batch.offsets == {TP: 1}
    led.aborted("injected")
    b = _admit(led, 1, "http://a/2")
    led.finish(b, [_out(1)], ("DONE", 0))
    assert led.take_commit({TP: 2}) is None
    assert led.take_commit({}) is None


def test_lost_partitions_poison_the_ledger() -> None:
    led = Ledger()
    led.assign([TP], {TP: 5})
    led.poison("partitions lost")
    assert led.take_commit({TP: 9}) is None


def test_a_revoked_partitions_results_leave_with_it() -> None:
    """Finished but uncommitted work of a revoked partition is the next owner's to redo:
    it must not ride along in a later transaction of another partition."""
    other = ("crawl.frontier", 1)
    led = Ledger()
    led.assign([TP, other], {TP: 0, other: 0})
    mine = _admit(led, 0, "http://a/1")
    led.finish(mine, [_out(0)], ("DONE", 0))
    led.forget([TP])  # lost between finish and commit (no callback commit got it out)
    theirs = Pending(other, -1, led.epochs[other], _job("http://b/"), "default|http://b/",
                     park_key=b"b\x00\x01k")
    led.finish(theirs, [_out(1)], ("DONE", 0))
    batch = led.take_commit({})
    assert batch is not None
    assert [o.key for o in batch.outputs] == [b"k1"]
    assert set(batch.seen) == {(1, "default|http://b/")}
    assert not led.is_duplicate(Pending(TP, 0, led.epochs.get(TP, 0), mine.job, mine.key),
                                NONE_SEEN)
