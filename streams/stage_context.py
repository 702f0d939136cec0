"""What the runtime hands a batch stage that declares state: its stores, its timers, broker time.

A stage names its stores and timer stores in its ``StageSpec``; the runtime opens each
(:class:`~streams.declared_store.DeclaredStore`, :class:`~streams.declared_store.TimerStore`,
one RocksDB per owned partition), restores them when partitions are assigned (off the poll
thread, the partitions paused until every store of theirs is complete), applies a batch's
writes after its transaction commits, forgets them when it aborts, drops a revoked
partition's stores and closes them all when the worker stops. The stage only reads and
writes through ``context.store(name)`` and ``context.timer(name)``.

Timers fire on the broker's clock: :class:`~streams.timers.BrokerClock` bounds broker-now
from below by every broker timestamp seen (LogAppendTime of the stage's input records and of
the timer changelogs read in a restore, and the delivery report of a tiny probe write while
timers wait), so a timer can fire late, never early. Between polls the runtime takes what is
due in each usable partition whose offsets this generation committed (:meth:`fire`): the
stage's ``on_timer`` turns each into outputs, and the timer's tombstone goes in the same
transaction, so a timer fires once, whatever restarts or rebalances come between.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from core.config import Settings
from core.errors import DecodeError
from schemas.stages import StageSpec, StoreDecl, TimerDecl
from schemas.topics import Topology
from streams import timers
from streams.broker_time import BrokerTimeProbe
from streams.declared_store import DeclaredStore, TimerStore
from streams.io import Encoder, Output
from streams.restorer import Restored
from streams.state_store import META, store_dir
from streams.status import StatusFile
from streams.store_open import open_store
from streams.timers import BrokerClock

log = logging.getLogger("crawlfleet.stage")

#: Due timers fired per transaction (each is the stage's outputs plus a tombstone).
FIRE_BATCH = 1000
#: While timers wait, refresh the broker-time bound this often with a probe write.
PROBE_EVERY_S = 30.0
#: Key of the probe record: a tombstone under the stores' reserved prefix, which restores
#: skip and compaction removes.
PROBE_KEY = META + b"clock-probe"
TP = tuple[str, int]
#: The stage's answer to a due timer: (timer store, partition, the timer's id, its record)
#: → outputs.
OnTimer = Callable[[str, int, bytes, dict[str, Any]], list[Output]]


class StageContext:
    """The declared stores and timer stores of one stage worker, and its broker clock."""

    def __init__(self, settings: Settings, topology: Topology, spec: StageSpec, worker: str,
                 encoder: Encoder, status: StatusFile) -> None:
        self.settings, self.topology, self.spec = settings, topology, spec
        self.encoder, self.status = encoder, status
        self.clock = BrokerClock()
        self._stores: dict[str, DeclaredStore] = {}
        self._timers: dict[str, TimerStore] = {}
        for decl in spec.state:
            if isinstance(decl, StoreDecl) and decl.ttl_setting is not None:
                raise ValueError(f"{spec.name}: store {decl.name!r} has a TTL, which the batch "
                                 "runtime's stores do not keep (their values carry no write "
                                 "time)")
            local = open_store(decl.name, store_dir(settings, decl.name, worker),
                               tuning=decl.tuning if isinstance(decl, StoreDecl) else "default")
            topic = topology.prefix + decl.changelog
            if isinstance(decl, TimerDecl):
                self._timers[decl.name] = TimerStore(decl.name, topic, decl.record, local,
                                                     encoder, self._observe, decl.keyed)
            else:
                self._stores[decl.name] = DeclaredStore(decl.name, topic, decl.record, local,
                                                        encoder, self._observe)
        #: Live timers per usable partition, per timer store.
        self._counts: dict[str, dict[int, int]] = {name: {} for name in self._timers}
        #: Whether each timer store's timers are work still to do (read at every poll).
        self._holds_work = {d.name: d.holds_work for d in spec.timers}
        self._usable: set[int] = set()
        self._probe = BrokerTimeProbe(settings, f"{worker}-clock", self._observe,
                                      f"{spec.name} clock probe", log) if self._timers else None
        self._probed_at: float | None = None

    # --- what the stage uses --------------------------------------------------------------

    def store(self, name: str) -> DeclaredStore:
        return self._stores[name]

    def timer(self, name: str) -> TimerStore:
        return self._timers[name]

    def now_ms(self) -> int | None:
        """Broker time certainly reached now (ms); None while no broker time was seen."""
        return self.clock.now_ms(time.monotonic_ns())

    def observe(self, msg: Message) -> None:
        """An input record's broker time (LogAppendTime only: a producer's clock must never
        move the estimate, it could make timers early)."""
        ts_type, ts = msg.timestamp()
        if ts_type == TIMESTAMP_LOG_APPEND_TIME:
            self.clock.observe(ts, time.monotonic_ns())

    def _observe(self, broker_ms: int) -> None:
        self.clock.observe(broker_ms, time.monotonic_ns())

    @property
    def changelogs(self) -> frozenset[str]:
        return frozenset(s.topic for s in self._all())

    def _all(self) -> list[DeclaredStore]:
        return [*self._stores.values(), *self._timers.values()]

    def timers_live(self, holding: bool | None = None) -> int:
        """Live timers (of the stores that hold work, or not, if ``holding`` is given)."""
        return sum(sum(c.values()) for name, c in self._counts.items()
                   if holding is None or self._holds_work[name] is holding)

    # --- partitions (the runtime's restore-on-assign) -------------------------------------

    def restore(self, parts: set[int]) -> tuple[set[int], Any]:
        """Restore thread: every store of ``parts`` from its changelog (the group's committed
        offsets were read first, as stable offsets: a former owner's last writes are on the
        changelogs before we read them). Returns (the partitions not complete, live timers
        per timer store and partition)."""
        failed: set[int] = set()
        for st in self._all():
            for part in parts:
                st.drop(part)  # a leftover DB is reopened from its checkpoint
            failed |= st.store.restore(self.settings, st.topic, parts, st.restore_value,
                                       self.settings.restore_timeout_s)
        for st in self._all():
            for part in failed:
                st.drop(part)  # unused until every store of it is complete
        counts = {name: {p: t.count(p) for p in parts - failed}
                  for name, t in self._timers.items()}
        return failed, counts

    def restored(self, done: Restored, info: Any) -> None:
        """A restore finished: its complete partitions are usable (their timers can fire)."""
        counts: dict[str, dict[int, int]] = info if info is not None else {}
        for part in done.complete:
            self._usable.add(part)
            for name in self._timers:
                self._counts[name][part] = counts.get(name, {}).get(part, 0)
        self._gauge()

    def revoked(self, parts: set[int]) -> None:
        """The partitions moved: their stores close (the files stay as a checkpoint)."""
        for part in parts:
            self._usable.discard(part)
            for st in self._all():
                st.drop(part)
            for c in self._counts.values():
                c.pop(part, None)
        self._gauge()

    def usable(self) -> set[int]:
        return set(self._usable)

    # --- transactions ---------------------------------------------------------------------

    def committed(self, delivered: dict[TP, int]) -> None:
        """A batch committed: its writes reach the local stores (``delivered``: the last
        offset it wrote to each changelog partition)."""
        for st in self._all():
            nexts = {p: o + 1 for (t, p), o in delivered.items() if t == st.topic}
            delta = st.committed(self._usable, nexts)
            counts = self._counts.get(st.name)
            if counts is not None and isinstance(st, TimerStore):
                for part, d in delta.items():
                    counts[part] = counts.get(part, 0) + d
        self._gauge()

    def rolled_back(self) -> None:
        for st in self._all():
            st.rolled_back()

    def fire(self, fenced: set[int], on_timer: OnTimer) -> list[Output]:
        """Due timers of the usable partitions whose offsets this generation committed (so
        the transaction carrying them is fenced): the stage's outputs for each, and its
        tombstone."""
        if not self._timers:
            return []
        if self.timers_live() and self._probe_due():
            self._probe_clock()
        now = self.now_ms()
        if now is None:
            return []
        out: list[Output] = []
        fired = 0
        for name, timer in self._timers.items():
            counts = self._counts[name]
            for part in sorted(counts):
                if fired >= FIRE_BATCH:
                    break
                if part not in fenced or not counts[part]:
                    continue
                for key, raw in timer.due(part, now, FIRE_BATCH - fired):
                    out += self._fired(timer, part, key, raw, on_timer)
                    out += timer.remove(part, key)
                    fired += 1
        if fired:
            self.status.add("fired", fired)
        return out

    def _fired(self, timer: TimerStore, part: int, key: bytes, raw: bytes,
               on_timer: OnTimer) -> list[Output]:
        try:
            record = timer.decode(raw)
        except DecodeError as exc:  # restore checked it: only a schema removal gets here
            payload = timers.decode_value(raw)[1]
            return [self.encoder.dead(None, payload, timer.topic, exc.reason, str(exc), 1)]
        return on_timer(timer.name, part, timers.parse_key(key)[1], record)

    # --- broker time ----------------------------------------------------------------------

    def _probe_due(self) -> bool:
        return self._probed_at is None or time.monotonic() - self._probed_at >= PROBE_EVERY_S

    def _probe_clock(self) -> None:
        """Tighten the broker-time bound with the LogAppendTime of a write of our own: with
        no input arriving (only long timers left, or a restart whose restore read nothing
        new), the bound would otherwise rest on old observations and fire late."""
        assert self._probe is not None
        self._probed_at = time.monotonic()
        name, counts = next((n, c) for n, c in self._counts.items() if any(c.values()))
        self._probe.probe(self._timers[name].topic, min(p for p, n in counts.items() if n),
                          PROBE_KEY, 10.0)
        self.status.add("clock_probes")

    def _gauge(self) -> None:
        if self._timers:
            # work still to do (a drain waits for it) apart from what is only planned
            self.status.gauges["timers"] = self.timers_live(holding=True)
            self.status.gauges["timers_planned"] = self.timers_live(holding=False)

    def close(self) -> None:
        for st in self._all():
            st.store.close()
        if self._probe is not None:
            self._probe.close()
