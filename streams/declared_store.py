"""A store a stage declares, on the batch runtime: key → record, changelogged, committed first.

The runtime opens one :class:`DeclaredStore` per ``StoreDecl`` (and a
:class:`TimerStore` per ``TimerDecl``) and hands them to the stage through its context.
A write is a record on the store's changelog, produced in the transaction of the batch that
made it, and reaches the local :class:`~streams.state_store.StateStore` only after that
transaction committed (:meth:`DeclaredStore.committed`); an aborted batch's writes are
forgotten (:meth:`~DeclaredStore.rolled_back`) and come again with its replay. A read sees
committed state only.

Values are the declared Avro record, stored as it travels (``len(fp) | fingerprint |
payload``, :func:`streams.timers.encode_value`), so a restore needs no re-encoding and a
read decodes with the writer's schema.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from core.errors import DecodeError
from schemas.topics import HEADER_SCHEMA
from streams import timers
from streams.io import Encoder, Output
from streams.state_store import StateStore

Change = tuple[bytes, bytes | None]
#: A broker timestamp (ms) seen in a changelog record during a restore.
OnBrokerTime = Callable[[int], None]


def fingerprint_of(headers: Any) -> bytes:
    """The writer-schema fingerprint header of a record."""
    for k, v in headers or []:
        if k == HEADER_SCHEMA:
            return v if isinstance(v, bytes) else str(v).encode()
    raise ValueError("no schema fingerprint header")


class DeclaredStore:
    """One declared store of a stage: its local copy, its changelog, its pending writes."""

    def __init__(self, name: str, topic: str, record: str, store: StateStore,
                 encoder: Encoder, on_time: OnBrokerTime | None = None) -> None:
        self.name, self.topic, self.record = name, topic, record
        self.store, self.encoder = store, encoder
        self._on_time = on_time
        self._pending: dict[int, list[Change]] = defaultdict(list)

    # --- reads (committed state) ----------------------------------------------------------

    def get(self, part: int, key: bytes) -> dict[str, Any] | None:
        raw = self.store.get(part, key)
        return None if raw is None else self.decode(raw)

    def scan(self, part: int, start: bytes | None = None,
             limit: int = 100) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, stored value) pairs of ``part`` from ``start``, in key order."""
        return self.store.scan(part, limit=limit, start=start)

    def decode(self, raw: bytes) -> dict[str, Any]:
        """A stored value as its record (:class:`DecodeError` if its schema is gone)."""
        fingerprint, payload = timers.decode_value(raw)
        value: dict[str, Any] = self.encoder.codec.decode(self.record, payload,
                                                          [(HEADER_SCHEMA, fingerprint)])
        return value

    def counted(self, key: bytes) -> bool:
        """Is ``key`` an entry (counted), not bookkeeping of the store's own?"""
        return True

    def count(self, part: int, prefix: bytes = b"") -> int:
        n, start = 0, None
        while True:
            page = self.store.scan(part, prefix=prefix, limit=10_000, start=start)
            n += len(page)
            if len(page) < 10_000:
                return n
            start = page[-1][0] + b"\x00"

    # --- writes (pending until their transaction commits) ---------------------------------

    def put(self, part: int, key: bytes, target: str, value: Mapping[str, Any]) -> Output:
        """The changelog record that sets ``key`` of ``part`` (produce it in this batch)."""
        out = self.encoder.record(self.topic, target, key, value)
        if out.partition != part:  # a record on a partition its target does not hash to
            out = Output(out.topic, part, out.key, out.value, out.headers)
        assert out.value is not None
        self._pending[part].append(
            (key, timers.encode_value(fingerprint_of(out.headers), out.value)))
        return out

    def delete(self, part: int, key: bytes) -> Output:
        """The changelog tombstone that deletes ``key`` of ``part``."""
        self._pending[part].append((key, None))
        return Output(self.topic, part, key, None, [])

    def committed(self, usable: set[int], next_offsets: dict[int, int]) -> dict[int, int]:
        """The batch committed: its writes to ``usable`` partitions reach the local store,
        whose checkpoint moves past them (``next_offsets``: partition → the changelog offset
        after the transaction's last write). Returns each partition's change in entries."""
        delta: dict[int, int] = {}
        for part, changes in self._pending.items():
            if part not in usable:
                continue  # not (or no longer) a usable partition
            latest = dict(changes)
            delta[part] = sum((v is not None) - (self.store.get(part, k) is not None)
                              for k, v in latest.items() if self.counted(k))
            self.store.apply(part, changes)
        self._pending.clear()
        self.store.advance({p: o for p, o in next_offsets.items() if p in usable})
        return delta

    def rolled_back(self) -> None:
        self._pending.clear()  # never committed: the replay produces them again

    # --- partitions -----------------------------------------------------------------------

    def restore_value(self, msg: Message) -> bytes | None:
        """Changelog record → stored bytes (None: unreadable, skipped); hands its broker
        time to the stage's clock."""
        ts_type, ts = msg.timestamp()
        if ts_type == TIMESTAMP_LOG_APPEND_TIME and self._on_time is not None:
            self._on_time(ts)
        value = msg.value()
        if value is None or isinstance(value, str):
            return None
        if self.raw_entry(msg.key()):
            return value
        try:
            self.encoder.decode(msg)
            return timers.encode_value(fingerprint_of(msg.headers()), value)
        except (DecodeError, ValueError):
            return None

    def raw_entry(self, key: Any) -> bool:
        """Is the changelog record of ``key`` stored as it is (bookkeeping, not a record)?"""
        return False

    def latest(self, part: int, key: bytes) -> bytes | None:
        """``key``'s stored value as this batch left it (its pending writes first)."""
        for k, v in reversed(self._pending.get(part, ())):
            if k == key:
                return v
        return self.store.get(part, key)

    def put_raw(self, part: int, key: bytes, value: bytes) -> Output:
        """A changelog record of the store's own bookkeeping (bytes, not a record)."""
        self._pending[part].append((key, value))
        return Output(self.topic, part, key, value, [])

    def drop(self, part: int) -> None:
        self.store.drop(part)
        self._pending.pop(part, None)


class TimerStore(DeclaredStore):
    """A declared timer store: records keyed by due time (broker ms) then an id; with
    ``keyed``, at most one timer per id (:mod:`streams.timers`)."""

    def __init__(self, name: str, topic: str, record: str, store: StateStore,
                 encoder: Encoder, on_time: OnBrokerTime | None = None,
                 keyed: bool = False) -> None:
        super().__init__(name, topic, record, store, encoder, on_time)
        self.keyed = keyed

    def counted(self, key: bytes) -> bool:
        return key.startswith(timers.KEY_PREFIX)

    def count(self, part: int, prefix: bytes = timers.KEY_PREFIX) -> int:
        return super().count(part, prefix)

    def raw_entry(self, key: Any) -> bool:
        return self.keyed and isinstance(key, bytes) and key.startswith(timers.INDEX_PREFIX)

    def due_of_id(self, part: int, ident: bytes) -> int | None:
        """A keyed store's due time for ``ident`` (this batch's writes included)."""
        raw = self.latest(part, timers.index_key(ident))
        return None if raw is None else timers.decode_due(raw)

    def schedule(self, part: int, due_ms: int, ident: bytes, target: str,
                 value: Mapping[str, Any]) -> list[Output]:
        """Hold ``value`` until broker time ``due_ms``; the same (due, id) overwrites, and in
        a keyed store the id's earlier timer is moved, not kept beside it."""
        out: list[Output] = []
        if self.keyed:
            old = self.due_of_id(part, ident)
            if old is not None and old != due_ms:
                out.append(self.delete(part, timers.timer_key(old, ident)))
            out.append(self.put_raw(part, timers.index_key(ident), timers.encode_due(due_ms)))
        out.append(self.put(part, timers.timer_key(due_ms, ident), target, value))
        return out

    def remove(self, part: int, key: bytes) -> list[Output]:
        """Delete a (fired) timer, and its index entry in a keyed store."""
        out = [self.delete(part, key)]
        if self.keyed:
            due, ident = timers.parse_key(key)
            if self.due_of_id(part, ident) == due:
                out.append(self.delete(part, timers.index_key(ident)))
        return out

    def cancel(self, part: int, ident: bytes) -> list[Output]:
        """A keyed store's timer of ``ident`` is deleted (nothing if it has none)."""
        due = self.due_of_id(part, ident)
        return [] if due is None else self.remove(part, timers.timer_key(due, ident))

    def due(self, part: int, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """The partition's leading timers due at ``now_ms`` (at most ``limit``)."""
        got: list[tuple[bytes, bytes]] = []
        start: bytes | None = None
        while len(got) < limit:
            page = self.store.scan(part, prefix=timers.KEY_PREFIX,
                                   limit=min(100, limit - len(got)), start=start)
            due = timers.due_keys((k for k, _ in page), now_ms, limit - len(got))
            got.extend(page[:len(due)])
            if len(due) < len(page) or not page:
                break
            start = page[-1][0] + b"\x00"
        return got
