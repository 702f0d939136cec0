"""What every part of one fetch session shares: its settings, topology, encoder, ledger,
outcome rules, status file and wake-up event, made once by the session and handed on as
one record, so a part's constructor names only what is its own."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from consumers.fetch.outcomes import OutcomeRules
from core.config import Settings
from schemas.topics import Topology
from streams.io import Encoder
from streams.ledger import Ledger
from streams.status import StatusFile


@dataclass(frozen=True)
class FetchWiring:
    """One fetch session's shared parts (dropped with the session)."""

    s: Settings
    topo: Topology
    enc: Encoder
    ledger: Ledger
    rules: OutcomeRules
    status: StatusFile
    #: Set to wake the dispatcher: a job queued, a request finished, a commit done.
    wake: asyncio.Event
