"""Publishing to the fleet's control topic, ``crawl.control``: ``crawlfleet pause``,
``resume``, live caps and the approved set of version tuples (what workers read:
:mod:`streams.control`)."""

from __future__ import annotations

import getpass

from core.config import Settings
from core.errors import KafkaStageError
from core.versions import VersionTuple
from infra.topics import topology_of
from schemas.codec import default_codec
from schemas.records import Control
from streams.control import END_HELD, ControlReader, approved_key, cap_key, pause_key
from streams.io import Encoder, connected_producer, producer_conf


def _send(settings: Settings, key: str, value: Control | None) -> None:
    _send_all(settings, [(key, value)])


def _send_all(settings: Settings, records: list[tuple[str, Control | None]]) -> None:
    """Produce ``records`` together (one batch, in order) and wait for all of them."""
    topology = topology_of(settings)
    producer = connected_producer(producer_conf(settings, "crawlfleet-control"))
    encoder = Encoder(topology, "control")
    for key, value in records:
        out = encoder.control(key, value)
        producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers,
                         partition=out.partition)
    if producer.flush(30):
        raise KafkaStageError(f"control records {[k for k, _ in records]} were not delivered")


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def pause(settings: Settings, target: str | None = None) -> None:
    """Stop every fetch worker from dequeuing (globally or for one target)."""
    _send(settings, pause_key(target), {"kind": "pause", "target": target, "value": None,
                                        "text": None, "issued_by": _who()})


def resume(settings: Settings, target: str | None = None) -> None:
    """Undo :func:`pause` (a tombstone: compaction then forgets the pause)."""
    _send(settings, pause_key(target), None)


def end_held(settings: Settings) -> None:
    """A one-off crawl's drain: the jobs a quarantine holds end as dead letters
    ``quarantined`` (its own namespace only; a deployed fleet keeps waiting them out)."""
    _send(settings, END_HELD, {"kind": "end_held", "target": None, "value": None,
                               "text": None, "issued_by": _who()})


def set_cap(settings: Settings, target: str, rate: float | None) -> None:
    """Set (or with None, clear) a live per-target cap in requests per second."""
    if rate is None:
        _send(settings, cap_key(target), None)
    else:
        _send(settings, cap_key(target), {"kind": "cap", "target": target, "value": rate,
                                          "text": None, "issued_by": _who()})


def approve(settings: Settings, versions: list[VersionTuple]) -> None:
    """Add ``versions`` to the approved set, in one write: once the set is non-empty, only
    workers running as an approved tuple consume (approving every tuple in use at once
    turns enforcement on without a worker leaving in between)."""
    who = _who()
    _send_all(settings, [(approved_key(str(v)), {"kind": "approved", "target": None,
                                                  "value": None, "text": str(v),
                                                  "issued_by": who}) for v in versions])


def revoke(settings: Settings, version: VersionTuple) -> None:
    """Take ``version`` out of the approved set (a tombstone); its running workers leave
    their groups. Revoking the last tuple empties the set: nothing is enforced then."""
    _send(settings, approved_key(str(version)), None)


#: How long reading the approved set waits for the control topic's end.
READ_TIMEOUT_S = 30.0


def approved(settings: Settings) -> set[str]:
    """The approved set in force: the control topic read to its end."""
    reader = ControlReader(settings, topology_of(settings).control, default_codec())
    try:
        if not reader.catch_up(READ_TIMEOUT_S):
            raise KafkaStageError(f"cannot read {topology_of(settings).control} to its end "
                                  f"within {READ_TIMEOUT_S:.0f} s")
        return set(reader.state.approved)
    finally:
        reader.close()
