"""The approved set, enforced by the runtime for every stage (:class:`streams.stage.Stage`).

When ``crawl.control`` holds a non-empty approved set of version tuples, a worker whose
tuple (:func:`core.versions.worker_tuple`) is not in it consumes nothing:

- at start it joins no group: it logs the refusal once (its tuple, and the exact
  ``crawlfleet approve '...'`` that admits it), says ``refused: ...`` in its status file
  (the ``waiting`` text and the ``refused`` gauge), and re-reads the set every
  :data:`RECHECK_S`; an approval lets it start with no restart, so a supervisor that
  restarts dead workers (``crawl``'s Fleet, Kubernetes) sees a live, idle process, never a
  crash loop;
- running, it notices a revocation within :data:`CHECK_EVERY_S` of the record reaching it:
  its session ends between transactions (the fetch stage commits its finished work and
  drops what is in flight, as on SIGTERM), its consumer closes and the runtime removes its
  static membership at once (:mod:`streams.group_leave`), so its partitions go to the
  approved workers within seconds, not after the session timeout.

An empty set enforces nothing: a new fleet works before anyone approves.
"""

from __future__ import annotations

import logging
import time

from core.config import Settings
from core.versions import NotApprovedError, VersionTuple, refusal, worker_tuple
from schemas.codec import Codec
from streams.control import ControlReader
from streams.status import StatusFile
from streams.worker import StopFlag

log = logging.getLogger("crawlfleet.approval")

#: A running worker looks at the control topic this often (a poll with no wait).
CHECK_EVERY_S = 0.5
#: A refused worker re-reads the approved set this often.
RECHECK_S = 2.0
#: How long a starting worker waits for the control topic's end before it goes on
#: unchecked (the fetch stage's own control reader still waits for it: fetch never sends
#: a request unchecked).
CATCH_UP_S = 10.0


class ApprovalGate:
    """One worker's view of the approved set (its own reader of ``crawl.control``)."""

    def __init__(self, settings: Settings, topic: str, codec: Codec, status: StatusFile,
                 what: str) -> None:
        self.settings, self.topic, self.codec = settings, topic, codec
        self.status, self.what = status, what
        self.mine: VersionTuple = worker_tuple(settings)
        self._reader: ControlReader | None = None
        self._checked_at = 0.0
        self._said: str | None = None

    def _read(self) -> ControlReader:
        if self._reader is None:
            self._reader = ControlReader(self.settings, self.topic, self.codec)
            if not self._reader.catch_up(CATCH_UP_S):
                log.warning("%s: cannot read %s to its end; the approved set is applied as "
                            "it arrives", self.what, self.topic)
        return self._reader

    def refused(self) -> str | None:
        """Why this worker must not consume now (None: it may), read at most every
        :data:`CHECK_EVERY_S` (a poll that does not wait)."""
        reader = self._read()
        now = time.monotonic()
        if now - self._checked_at >= CHECK_EVERY_S:
            self._checked_at = now
            reader.poll(0)
        return refusal(reader.state.approved, self.mine)

    def check(self) -> None:
        """Raise :class:`NotApprovedError` if this worker's tuple is no longer approved."""
        why = self.refused()
        if why is not None:
            raise NotApprovedError(why)

    def wait_approved(self, stop: StopFlag) -> bool:
        """Return once this worker may consume (True), or when stopped first (False);
        while refused, say so (log once per reason, the status file) and re-check."""
        while not stop.requested:
            why = self.refused()
            if why is None:
                if self._said is not None:
                    log.info("%s: version tuple %s approved; consuming", self.what, self.mine)
                    self._said = None
                    self.status.waiting_for("", "refused")
                return True
            if why != self._said:
                log.error("%s refuses to consume: %s", self.what, why)
                self._said = why
                self.status.add("refusals")
            self.status.waiting_for(f"refused: {why}", "refused")
            stop.wait(RECHECK_S)
            self._checked_at = 0.0  # the next look reads the topic
        return False

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
