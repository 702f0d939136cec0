"""The one stage abstraction: a worker of a consumer group, living one session at a time.

Every stage (fetch, parse, store, retry and any a user registers) is a :class:`Stage`: its
identity (worker id = transactional id = static member id), its stop flag, its status file
and its record encoder, and one loop that runs sessions until stopped. A session is one
membership of the group: consumer, producer and in-memory state, all dropped together when
it ends badly (fenced, an aborted or unknown commit, a fatal consumer error): the next
session reads its state and offsets from what is committed, so nothing of the failed work
is committed later. No session starts, and a running one ends, while the worker's version
tuple is outside a non-empty approved set (:mod:`streams.approval`). What a session does is
the runtime's flavour, in its own module:

- :mod:`streams.batch_stage` — a synchronous transform, one transaction per poll batch
  (parse, retry);
- :mod:`streams.async_session` — an asyncio stage with many records in flight, its Kafka
  calls on one thread (fetch);
- :mod:`streams.sink_stage` — an idempotent sink committing offsets after its write (store).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import ClassVar

from core.config import Settings
from core.errors import KafkaStageError
from core.versions import NotApprovedError
from infra.topics import topology_of
from schemas.codec import Codec
from streams.approval import ApprovalGate
from streams.group_leave import leave_group
from streams.io import Encoder, FencedError, StaleMembershipError
from streams.status import PollGaps, StatusFile
from streams.worker import REJOIN_PAUSE_S, StopFlag, wait_for_kafka, worker_name

log = logging.getLogger("crawlfleet.stage")


class Stage(ABC):
    """A stage's worker: ``Class(settings, worker_id, stop)``, then :meth:`run`."""

    stage: ClassVar[str]

    def __init__(self, settings: Settings, worker_id: str | None = None,
                 stop: StopFlag | None = None, codec: Codec | None = None) -> None:
        self.settings = settings
        self.topology = topology_of(settings)
        self.worker = worker_name(self.stage, worker_id, settings.data_dir / "workers")
        self.stop = stop if stop is not None else StopFlag()
        self.encoder = Encoder.of_stage(self.topology, self.stage, self.worker, codec)
        self.status = StatusFile(settings.status_dir, self.stage, self.worker)
        self.poll_gaps = PollGaps(self.status)
        #: The approved set of version tuples, enforced before and during every session.
        self.approval = ApprovalGate(settings, self.topology.control, self.encoder.codec,
                                     self.status, f"{self.stage} {self.worker}")

    @property
    def s(self) -> Settings:
        return self.settings

    def run(self) -> None:
        """Serve until stopped; the status file goes with the worker."""
        try:
            self.serve()
        finally:
            self.approval.close()
            self.status.remove()

    def serve(self) -> None:
        """Sessions until stopped. A stage holding something across sessions (the store's
        database) opens it here and calls :meth:`rejoining` inside."""
        self.rejoining()

    def rejoining(self) -> None:
        """Run :meth:`session` until stopped; after one that lost its standing, pause and
        wait for the broker, then join again (within the session timeout, so static
        membership keeps the partitions). No session starts while the worker's version
        tuple is not approved; one whose tuple is revoked ends, leaves its group at once
        and waits for an approval."""
        while not self.stop.requested:
            if not self.approval.wait_approved(self.stop):
                return
            try:
                self.session()
            except NotApprovedError as exc:
                began = time.monotonic()
                left = leave_group(self.settings, self.topology.group(self.stage),
                                   self.worker)
                log.warning("%s %s left its group%s: %s", self.stage, self.worker,
                            f" ({time.monotonic() - began:.2f} s)" if left
                            else " (its partitions move after the session timeout)", exc)
                self.status.add("left_unapproved")
            except (FencedError, KafkaStageError) as exc:
                log.warning("%s %s lost its session, dropping its work and rejoining: %s",
                            self.stage, self.worker, exc)
                self.status.add("fenced")
                if isinstance(exc, StaleMembershipError):
                    self._leave_for_rejoin()
                self.stop.wait(REJOIN_PAUSE_S)  # a broker that is down fails at once
                wait_for_kafka(self.settings, self.stop, self.status,
                               f"{self.stage} {self.worker}")

    def _leave_for_rejoin(self) -> None:
        """Leave the group by instance id, so the next session joins as a new member: the
        assignor then places every partition, those this worker gave up included (see
        :class:`~streams.io.StaleMembershipError`). Never on a fencing: the instance id
        may then be a newer twin's."""
        if leave_group(self.settings, self.topology.group(self.stage), self.worker):
            self.status.add("left_for_rejoin")

    @abstractmethod
    def session(self) -> None:
        """One membership of the group, until stopped or it fails; it starts from what is
        committed (state restored, offsets read), never from the last session's memory."""
