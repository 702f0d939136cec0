"""Jobs a quarantine holds, said as such, and what a one-off crawl's drain makes of them.

A pinned job whose (target, profile) is quarantined waits (it is never sent as another
identity), as does any job of a target with no eligible identity left, or of a target
quarantined as a whole: until the quarantine ends, ``quarantine_s`` (1,800 s) by default.
A deployed fleet keeps waiting. A one-off ``crawl``, whose drain would wait that long with
nothing else to do, says so and ends them (the control record ``END_HELD`` in its own
namespace): each becomes a dead letter ``quarantined`` naming the quarantine and its end.
What is held, and until when, is in the fetch worker's status (the ``quarantine_held``
gauge, and a note per target) for ``crawl`` and ``top`` to show. Pure logic.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.timefmt import iso_utc
from streams.control import Quarantine

#: A dead letter's reason for a job a quarantine held when its one-off crawl drained.
QUARANTINED = "quarantined"


def active_for(quarantines: Iterable[Quarantine], target: str, now_ms: int) -> list[Quarantine]:
    """The quarantines in force for ``target``."""
    return [q for q in quarantines if q.target == target and q.active(now_ms)]


def hold_of(quarantines: Iterable[Quarantine], target: str, profile: str,
            now_ms: int) -> Quarantine | None:
    """What holds a job of ``target`` sent as ``profile``: the target's own quarantine,
    else its profile's, else the one ending last (no identity left that none holds)."""
    found = active_for(quarantines, target, now_ms)
    for scope, name in (("target", ""), ("profile", profile)):
        for q in found:
            if q.scope == scope and (scope == "target" or q.name == name):
                return q
    return max(found, key=lambda q: q.until_ms, default=None)


def describe(q: Quarantine | None, target: str) -> str:
    """A held job's dead-letter text: which quarantine, until when, why."""
    if q is None:
        return (f"held for {target}: no identity left that a quarantine does not hold; "
                "a one-off crawl ends such jobs at its drain")
    what = "the target" if q.scope == "target" else f"{q.scope} {q.name}"
    return (f"{what} quarantined for {target} until {iso_utc(q.until_ms / 1000)}"
            f"{': ' + q.reason if q.reason else ''}; a one-off crawl ends such jobs at its "
            "drain (a deployed fleet waits)")


def summary(held: dict[str, int], quarantines: Iterable[Quarantine],
            now_ms: int) -> dict[str, str]:
    """The status note: per target with held jobs, how many and until when (the latest
    end of its quarantines in force: when the last of them lets go)."""
    qs = list(quarantines)
    out = {}
    for target, n in sorted(held.items()):
        if n <= 0:
            continue
        ends = [q.until_ms for q in active_for(qs, target, now_ms)]
        out[target] = f"{n} jobs" + (f" until {iso_utc(max(ends) / 1000)}" if ends else "")
    return out
