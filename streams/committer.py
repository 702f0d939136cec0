"""The transactional commit every stage shares: outputs and input offsets in one transaction.

Every stage is consume → transform → produce, and commits its outputs together with its
input offsets (sent with the consumer group metadata, KIP-447) in one Kafka transaction.
A stale owner's commit is rejected by the broker (producer epoch / group generation), so
no worker's local clock ever decides who owns a partition.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from core.config import Settings
from core.errors import CrawlfleetError, KafkaStageError
from streams import faults
from streams.io import (
    FencedError,
    Output,
    StaleMembershipError,
    connected_producer,
    producer_conf,
    transaction_timeout_ms,
)

log = logging.getLogger("crawlfleet.runtime")
R = TypeVar("R")


class TxnAbortedError(KafkaStageError):
    """The transaction was aborted; the stage must rewind to its committed offsets."""

    reason = "txn_aborted"


class GenerationMovedError(TxnAbortedError, StaleMembershipError):
    """The offsets were refused because the group's generation moved on while the
    transaction ran (a member joined or left): aborted, and the session ends in the middle
    of that rebalance (see :class:`~streams.io.StaleMembershipError`)."""

    reason = "generation_moved"


#: Offset-commit errors that mean the group rebalanced under the transaction.
GENERATION_ERRORS = (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                     KafkaError.REBALANCE_IN_PROGRESS)



class TxnCommitter:
    """Owns a transactional producer: outputs + input offsets commit atomically, or not at all.

    A commit gets one transaction timeout in all (its produce, offsets and commit calls
    retried within it), never more: it runs on the thread that polls the consumer, and a
    cluster that went down at once used to keep that thread in retries of 30-s calls for
    five minutes, until the consumer left its group for not polling. Past the budget the
    transaction's outcome is unknown; the session ends, and the next one's producer
    (``init_transactions`` under the same id) fences this one and settles it — committed
    or aborted, which the next session reads from the group's committed offsets.
    """

    def __init__(self, settings: Settings, transactional_id: str, client_id: str) -> None:
        self.transactional_id = transactional_id
        #: Seconds a whole commit (or the producer's start) may take.
        self.budget_s = transaction_timeout_ms(settings) / 1000
        self.clock: Callable[[], float] = time.monotonic
        self.sleep: Callable[[float], None] = time.sleep
        self.producer = connected_producer(producer_conf(settings, client_id, transactional_id))
        self._run("init_transactions", self.producer.init_transactions,
                  self.clock() + self.budget_s)

    def commit(self, consumer: Consumer, outputs: Iterable[Output],
               offsets: list[TopicPartition],
               track: frozenset[str] = frozenset()) -> dict[tuple[str, int], int]:
        """Produce ``outputs`` and commit ``offsets`` of ``consumer``'s group atomically.

        Returns the last offset written to each partition of the ``track`` topics (state
        changelogs), so a store can move its checkpoint past its own committed writes.
        """
        written: dict[tuple[str, int], int] = {}
        deadline = self.clock() + self.budget_s

        def delivered(err: KafkaError | None, msg: Any) -> None:
            offset = msg.offset()
            if err is None and offset is not None and offset >= 0:
                key = (msg.topic(), msg.partition())
                written[key] = max(written.get(key, -1), offset)

        self._run("begin_transaction", lambda _t: self.producer.begin_transaction(), deadline,
                  watch=False)
        try:
            for o in outputs:
                self._produce(o, delivered if o.topic in track else None, deadline)
            faults.stall("stall_commit")
            if offsets:
                meta = consumer.consumer_group_metadata()
                faults.stall("stall_offsets")  # the metadata ages meanwhile
                self._run("send_offsets_to_transaction",
                          lambda t: self.producer.send_offsets_to_transaction(offsets, meta, t),
                          deadline)
            faults.point("before_commit")
            if faults.fails("abort_commit"):
                raise TxnAbortedError("fault injection: the transaction must abort")
            self._run("commit_transaction", self.producer.commit_transaction, deadline)
            faults.point("after_commit")
        except TxnAbortedError:
            self._abort()
            raise
        # commit_transaction flushed every record and served their delivery reports.
        return written

    def _produce(self, o: Output, on_delivery: Callable[..., None] | None,
                 deadline: float) -> None:
        while True:
            try:
                if on_delivery is None:
                    self.producer.produce(o.topic, value=o.value, key=o.key,
                                          partition=o.partition, headers=o.headers)
                else:
                    self.producer.produce(o.topic, value=o.value, key=o.key,
                                          partition=o.partition, headers=o.headers,
                                          on_delivery=on_delivery)
                return
            except BufferError:
                if self.clock() >= deadline:
                    raise self._late("produce (the producer's queue stayed full)") from None
                self.producer.poll(0.05)  # queue full: let deliveries drain
            except KafkaException as exc:
                raise _classify(exc) from exc

    def _abort(self) -> None:
        try:
            self.producer.abort_transaction(self.budget_s)
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal():
                raise FencedError(f"abort failed fatally: {err}") from exc

    def _run(self, what: str, call: Callable[[float], Any], deadline: float,
             watch: bool = True) -> Any:
        """``call(timeout)`` until it succeeds, a non-retriable error, or ``deadline``;
        ``watch`` a call that asks a broker (a local one, begin_transaction, needs no
        watcher thread)."""
        attempt = 0
        while True:
            left = deadline - self.clock()
            if left <= 0:
                raise self._late(what)
            try:
                if not watch:
                    return call(left)
                with CallWatch(self.producer, f"{self.transactional_id}: {what}", left):
                    return call(left)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if not err.retriable() or err.txn_requires_abort():
                    raise _classify(exc) from exc
                attempt += 1
                log.info("%s: %s failed (%s), retrying", self.transactional_id, what, err.str())
                self.sleep(min(0.2 * attempt, 1.0, max(0.0, deadline - self.clock())))

    def _late(self, what: str) -> KafkaStageError:
        return KafkaStageError(
            f"{what} did not finish within the transaction timeout ({self.budget_s:.0f} s); "
            "the transaction's outcome is left to the next session's producer")

    def close(self) -> None:
        try:
            self.producer.flush(5)
        except KafkaException as exc:  # a fenced producer has nothing left worth flushing
            log.info("producer %s closed after: %s", self.transactional_id, exc)


class CallWatch:
    """Watches one transactional call that librdkafka may not return from in its timeout.

    ``send_offsets_to_transaction`` ignores its timeout while the group coordinator it
    cached sits on a broker librdkafka dropped (librdkafka#5456, #5511: after a whole-cluster
    restart). Past its timeout the watch says so and refreshes the producer's metadata (the
    refresh brings the brokers back, which wakes the coordinator lookup); a call still
    stuck ``HANG_GRACE_S`` past its timeout cannot be cancelled, and the worker leaves the
    process so its supervisor starts it again: its next producer fences this one and settles
    the transaction, and its partitions' work is redone from the committed offsets. The
    refresh does not always help: a coordinator cached on a broker librdkafka decommissioned
    (a broker that left the metadata during a rolling restart, librdkafka#5511) is looked up
    again only when another broker changes state, which may never come; a rolling restart's
    fetch worker was stuck 120 s that way. Meanwhile the fetch stage starts no request
    (``commit_stall_s``), so the wait costs its partitions' pace, not repeated work.
    """

    NUDGE_EVERY_S = 5.0
    HANG_GRACE_S = 20.0
    EXIT_CODE = 75  # EX_TEMPFAIL: start me again

    def __init__(self, producer: Producer, what: str, timeout_s: float) -> None:
        self.producer = producer
        self.what = what
        self.timeout_s = timeout_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="txn-call-watch")

    def __enter__(self) -> CallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _watch(self) -> None:
        began = time.monotonic()
        if self._done.wait(self.timeout_s + self.NUDGE_EVERY_S):
            return
        while not self._done.is_set():
            waited = time.monotonic() - began
            if waited >= self.timeout_s + self.HANG_GRACE_S:
                log.critical("%s has not returned after %.0f s (its timeout: %.0f s; "
                             "librdkafka#5456): the worker restarts", self.what, waited,
                             self.timeout_s)
                logging.shutdown()
                os._exit(self.EXIT_CODE)
            log.warning("%s has not returned after %.0f s (its timeout: %.0f s; "
                        "librdkafka#5456): refreshing metadata", self.what, waited,
                        self.timeout_s)
            with contextlib.suppress(KafkaException):
                self.producer.list_topics(timeout=self.NUDGE_EVERY_S)
            self._done.wait(self.NUDGE_EVERY_S)


def on_kafka_thread(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)``, with anything it raises turned into an exception.

    confluent-kafka can raise a bare ``KafkaError``, which is not an exception class (a
    rebalance callback served by ``close()`` did): it passes every ``except`` clause but a
    bare one, so a thread pool's worker thread died of it, the future it was running never
    completed, and the stage awaited it for ever while ignoring SIGTERM.
    """
    try:
        return fn(*args)
    except BaseException:
        raise
    except:  # noqa: E722 -- the one way to catch a raised non-exception object
        raise KafkaStageError(f"kafka client raised {sys.exc_info()[1]!r}") from None


def _classify(exc: KafkaException) -> CrawlfleetError:
    err: KafkaError = exc.args[0]
    if err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                     KafkaError.INVALID_PRODUCER_EPOCH,
                                     KafkaError.FENCED_INSTANCE_ID):
        return FencedError(f"transaction fenced: {err.str()}")
    if err.txn_requires_abort() and err.code() in GENERATION_ERRORS:
        return GenerationMovedError(f"transaction must abort, the group rebalanced: "
                                    f"{err.str()}")
    if err.txn_requires_abort():
        return TxnAbortedError(f"transaction must abort: {err.str()}")
    return KafkaStageError(f"kafka error: {err.str()}")
