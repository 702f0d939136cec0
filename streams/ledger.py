"""The fetch stage's ledger: which jobs it holds, under which epoch, and what is safe to commit.

Pure bookkeeping, no I/O, shared by the event loop (admit, finish) and the Kafka thread
(rebalance callbacks, commits) under one lock:

- every owned frontier partition has an *epoch*, bumped when it is assigned or revoked, so
  work finishing after its partition moved is dropped (the next owner redoes it);
- an :class:`OffsetTracker` per partition commits only below the oldest record in flight;
- a dedupe key is *held* by the one job working on it, so a repeat is skipped while the
  first is in flight, but not once that holder's partition moved (or the job would be lost);
- dedupe-state and state-store changes of finished work are *pending* until the
  transaction carrying them commits, then *committing*, then applied by the stage: the
  local stores never hold aborted state;
- results are kept *per input partition* and leave only with that partition's offset, so a
  batch is never dropped for want of a position (a worker restarted with only parked work
  has consumed no record yet: its offsets are the group's committed ones, given at assign),
  and a revoked partition's uncommitted results go with it (the next owner redoes them);
- after any failed commit the ledger is *broken*: it hands out nothing more to commit, so
  no later commit (a revoke callback's, a clean stop's) can move offsets past the aborted
  work. The session must rebuild from what is committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from schemas.records import CrawlJob
from streams.io import Output
from streams.offsets import OffsetTracker

TP = tuple[str, int]
#: (partition, dedupe key) → (seen state, attempt), or None: the key's tombstone (a pruned
#: earlier visit's, ``consumers.fetch.visit_prune``)
SeenChanges = dict[tuple[int, str], tuple[str, int] | None]
#: (partition, store key, value or None to delete) for the parked-queue store
StoreChange = tuple[int, bytes, bytes | None]

RETRYING = "RETRYING"


@dataclass
class Pending:
    """A job between admission and completion, tagged with its partition's epoch.

    A job read from the frontier has its record's ``offset``; one taken back from the
    parked store has ``offset`` -1 and its ``park_key``, which its completion tombstones.
    """

    tp: TP
    offset: int
    epoch: int
    job: CrawlJob
    key: str
    park_key: bytes | None = None
    allowed_by: object | None = None  # robots rules already checked at dispatch: allowed
    #: The identity this attempt is sent as (the profile placed for it, the egress chosen
    #: for it): set at dispatch, carried by its telemetry event.
    profile: str = ""
    egress: str = "direct"

    @property
    def target(self) -> str:
        return str(self.job["target"])

    @property
    def ident(self) -> tuple[TP, int, int, bytes | None]:
        """Which job this is: jobs from disk all have offset -1, their park keys differ."""
        return self.tp, self.epoch, self.offset, self.park_key

    @property
    def tier(self) -> int:
        return int(self.job.get("priority", 0))

    @property
    def revisit(self) -> bool:
        """A revisit (visit > 0): it waits in its tier's revisit queue, beside new URLs."""
        return int(self.job.get("visit") or 0) > 0


@dataclass
class _Results:
    """Finished, uncommitted work of one input partition."""

    outputs: list[Output] = field(default_factory=list)
    seen: SeenChanges = field(default_factory=dict)
    changes: list[StoreChange] = field(default_factory=list)
    jobs: int = 0  # jobs finished with a result (a request that a crash would repeat)


@dataclass
class CommitBatch:
    """What one transaction carries, and what to apply locally once it committed."""

    outputs: list[Output]
    offsets: dict[TP, int]
    seen: SeenChanges = field(default_factory=dict)
    changes: list[StoreChange] = field(default_factory=list)
    jobs: int = 0


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trackers: dict[TP, OffsetTracker] = {}
        self.epochs: dict[TP, int] = {}
        self._results: dict[TP, _Results] = {}
        self._pending_seen: SeenChanges = {}  # every partition's, for duplicate checks
        self._committing_seen: SeenChanges = {}
        self._committing_jobs = 0
        self._holders: dict[str, tuple[TP, int, int, bytes | None]] = {}

    # --- ownership ------------------------------------------------------------------------

        self.broken: str | None = None  # why nothing may be committed any more

    def assign(self, tps: list[TP], committed: dict[TP, int] | None = None) -> None:
        """Own ``tps`` from their ``committed`` offsets (the group's, read before the
        partition is used): results of parked jobs can then commit before any new record
        of the partition is consumed."""
        with self.lock:
            for tp in tps:
                offset = (committed or {}).get(tp, -1)
                self.trackers[tp] = OffsetTracker(offset if offset >= 0 else None)
                self.epochs[tp] = self.epochs.get(tp, 0) + 1

    def revoke(self, tps: list[TP]) -> None:
        """Work finishing from now on is the next owner's to redo."""
        with self.lock:
            for tp in tps:
                self.epochs[tp] = self.epochs.get(tp, 0) + 1

    def forget(self, tps: list[TP]) -> set[int]:
        """Drop revoked partitions' trackers and their uncommitted results (the next owner
        redoes that work); returns the partition numbers still owned."""
        with self.lock:
            for tp in tps:
                self.trackers.pop(tp, None)
                gone = self._results.pop(tp, None)
                if gone is not None:
                    for ref in gone.seen:
                        self._pending_seen.pop(ref, None)
            return {tp[1] for tp in self.trackers}

    def owns(self, tp: TP) -> bool:
        with self.lock:
            return tp in self.trackers

    def current(self, tp: TP, epoch: int) -> bool:
        return self.epochs.get(tp) == epoch

    def epoch_of(self, tp: TP) -> int | None:
        """The epoch of an owned partition (None if not owned)."""
        with self.lock:
            return self.epochs[tp] if tp in self.trackers else None

    # --- jobs -----------------------------------------------------------------------------

    def admit(self, tp: TP, offset: int) -> int | None:
        """Start tracking a frontier record; its epoch, or None if the partition is gone."""
        with self.lock:
            tracker = self.trackers.get(tp)
            if tracker is None:
                return None
            tracker.start(offset)
            return self.epochs[tp]

    def is_duplicate(self, pj: Pending,
                     seen: Callable[[int, str], tuple[str, int] | None]) -> bool:
        """Another live job holds the key, or committed state says it was done."""
        holder = self._holders.get(pj.key)
        if holder is not None and self.epochs.get(holder[0]) == holder[1]:
            return True
        ref = (pj.tp[1], pj.key)
        state = self._pending_seen.get(ref) or self._committing_seen.get(ref) \
            or seen(pj.tp[1], pj.key)
        if state is None:
            return False
        return state[0] != RETRYING or state[1] != pj.job["attempt"]

    def hold(self, pj: Pending) -> None:
        self._holders[pj.key] = pj.ident

    def release(self, pj: Pending) -> None:
        """Only the job holding the key releases it (a skipped repeat must not)."""
        if self._holders.get(pj.key) == pj.ident:
            del self._holders[pj.key]

    def finish(self, pj: Pending, outputs: list[Output], seen: tuple[str, int] | None,
               changes: list[StoreChange] | None = None, drops: Collection[str] = ()) -> bool:
        """Record a job's results for the next transaction; False if its partition moved.

        ``drops``: dedupe keys of its partition deleted with it (their tombstones are among
        ``outputs``). They stay in force until the transaction commits: duplicate checks
        read them from the store, never from here."""
        self.release(pj)
        with self.lock:
            if self.epochs.get(pj.tp) != pj.epoch:
                return False
            res = self._results.setdefault(pj.tp, _Results())
            if seen is not None:
                ref = (pj.tp[1], pj.key)
                self._pending_seen[ref] = res.seen[ref] = seen
                res.jobs += 1
            for key in drops:
                res.seen[(pj.tp[1], key)] = None
            res.outputs.extend(outputs)
            if changes:
                res.changes.extend(changes)
            tracker = self.trackers.get(pj.tp)
            if tracker is not None and pj.offset >= 0:
                tracker.done(pj.offset)
            return True

    def finish_raw(self, tp: TP, offset: int, epoch: int, outputs: list[Output]) -> bool:
        """A record that never became a job (undecodable, invalid URL)."""
        with self.lock:
            if self.epochs.get(tp) != epoch:
                return False
            self._results.setdefault(tp, _Results()).outputs.extend(outputs)
            tracker = self.trackers.get(tp)
            if tracker is not None:
                tracker.done(offset)
            return True

    @property
    def completed(self) -> int:
        """Outputs waiting for the next transaction."""
        return sum(len(r.outputs) for r in self._results.values())

    @property
    def uncommitted(self) -> int:
        """Jobs whose results are finished but not committed (waiting or being committed):
        the requests a crash of this worker now would make the next owner repeat."""
        with self.lock:  # the Kafka thread changes the results while the loop asks
            return sum(r.jobs for r in self._results.values()) + self._committing_jobs

    def drop_holders(self, keep: Callable[[TP, int], bool]) -> None:
        self._holders = {k: h for k, h in self._holders.items() if keep(h[0], h[1])}

    # --- commits --------------------------------------------------------------------------

    def take_commit(self, positions: dict[TP, int]) -> CommitBatch | None:
        """The next transaction's content (None: nothing to commit).

        ``positions`` are the consumer's positions, past transaction markers: with nothing
        in flight they are safe to commit, so an idle stage's lag reaches 0. Pass none from
        a rebalance callback: served inside ``consume()``, it runs after records were
        returned that this ledger has not admitted yet, and a position past them would lose
        them. A transaction with outputs carries every owned partition's offset even if
        unchanged, so the broker checks this worker still owns them (a zombie's outputs
        would otherwise commit). Results of a partition with no offset to send yet stay
        for a later transaction; nothing is ever dropped here.
        """
        with self.lock:
            if self.broken is not None:
                return None
            for tp, pos in positions.items():
                tracker = self.trackers.get(tp)
                if tracker is not None and pos >= 0:
                    tracker.advance_to(pos)
            ready = [tp for tp, res in self._results.items()
                     if (res.outputs or res.changes or res.seen)
                     and tp in self.trackers]
            carrying = bool(ready)
            points = {tp: (t.safe_point() if carrying else t.commit_point())
                      for tp, t in self.trackers.items()}
            offsets = {tp: o for tp, o in points.items() if o is not None}
            if not offsets:
                return None  # nothing new, or we own nothing any more: not ours to commit
            batch = CommitBatch([], offsets)
            for tp in ready:
                res = self._results.pop(tp)
                batch.outputs.extend(res.outputs)
                batch.seen.update(res.seen)
                batch.changes.extend(res.changes)
                batch.jobs += res.jobs
                for ref in res.seen:
                    self._pending_seen.pop(ref, None)
            self._committing_seen = batch.seen
            self._committing_jobs = batch.jobs
            return batch

    def committed(self, batch: CommitBatch) -> None:
        with self.lock:
            self._committing_seen = {}
            self._committing_jobs = 0
            for tp, offset in batch.offsets.items():
                tracker = self.trackers.get(tp)
                if tracker is not None:
                    tracker.committed(offset)

    def aborted(self, why: str = "transaction failed") -> None:
        """The batch never committed: its dedupe state must not count as seen, and nothing
        may be committed any more in this session (offsets would pass the aborted work)."""
        with self.lock:
            self._committing_seen = {}
            self._committing_jobs = 0
            self.broken = why

    def poison(self, why: str) -> None:
        """Commit nothing more (partitions lost, a commit failed elsewhere)."""
        with self.lock:
            self.broken = self.broken or why
