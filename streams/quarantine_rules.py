"""The quarantine app's counting, as pure logic: blocks in → quarantines out.

One target's state (:class:`~schemas.records.QuarantineCounts`, the faust table's value,
keyed by target) holds, per scope ``profile|NAME`` and ``egress|NAME``, the ids of the
distinct blocked attempts within the window W with their event times, and the quarantines
already issued. A block is folded in with :func:`observe`:

- a block is a fetch event whose outcome is ``blocked`` (``block_statuses``: 403 by
  default; 429 only when configured there, else it is a ``retry`` and never counted);
- an id already held never counts again, so a replay after a crash (faust is at least
  once: the table's changelog may hold events whose offsets were not committed) never
  inflates a window;
- N distinct blocks within W of the newest (``ts > newest - W``), all after the scope's
  last quarantine, issue a quarantine of that scope until ``at + quarantine_s``; while it
  is active a repeat is not issued again (an idempotent record if it were: same key, and
  ``at`` is the triggering event's time, so a replay issues the very same record);
- a quarantine within W after a neighbour of the same kind (another profile, another
  egress) of the same target was quarantined is *second order*: a cascade, the figure the
  dashboard counts;
- when more than ``target_share`` of the profiles allowed for the target are quarantined,
  the whole target is quarantined (paused) instead of burning the rest.

Event times, never this process's clock: a replay computes exactly what the first run did.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from schemas.records import QuarantineCounts
from streams.control import Quarantine

#: The scopes counted per event (the ``target`` scope is derived from the profile ones).
COUNTED = ("profile", "egress")


@dataclass(frozen=True)
class Rules:
    """The trigger: ``blocks`` distinct blocks within ``window_ms`` retire a scope for
    ``quarantine_ms``; more than ``target_share`` of a target's profiles pause it."""

    blocks: int = 3
    window_ms: int = 600_000
    quarantine_ms: int = 1_800_000
    target_share: float = 0.5

    @property
    def keep(self) -> int:
        """Ids kept per scope at most: enough to see N in any window, bounded whatever
        the site does (the oldest beyond it can no longer decide a trigger)."""
        return max(4 * self.blocks, 16)


@dataclass(frozen=True)
class Block:
    """One blocked attempt, as its fetch event tells it."""

    event_id: str
    target: str
    profile: str
    egress: str
    ts_ms: int


@dataclass(frozen=True)
class Issued:
    """A quarantine to publish: the control record's content and what the store keeps."""

    quarantine: Quarantine
    at_ms: int
    second_order: bool
    blocks: int
    event_id: str


def empty(target: str) -> QuarantineCounts:
    return {"target": target, "windows": {}, "since": {}, "quarantines": {}}


def scope_key(scope: str, name: str) -> str:
    return f"{scope}|{name}"


def observe(state: QuarantineCounts, block: Block, rules: Rules,
            allowed_profiles: Collection[str]) -> list[Issued]:
    """Fold one block into its target's ``state`` (in place); the quarantines it issues.

    ``allowed_profiles`` are the profiles configured for the target (``Profile.allowed_for``):
    the target pauses when more than ``rules.target_share`` of them are quarantined.
    """
    out: list[Issued] = []
    names = {"profile": block.profile, "egress": block.egress}
    for scope in COUNTED:
        name = names[scope]
        if not name:
            continue
        issued = _count(state, scope, name, block, rules)
        if issued is not None:
            out.append(issued)
    if any(i.quarantine.scope == "profile" for i in out):
        paused = _target_pause(state, block, rules, allowed_profiles)
        if paused is not None:
            out.append(paused)
    prune(state, block.ts_ms, rules)
    return out


def _count(state: QuarantineCounts, scope: str, name: str, block: Block,
           rules: Rules) -> Issued | None:
    key = scope_key(scope, name)
    ids = state["windows"].setdefault(key, {})
    if block.event_id in ids:
        return None  # a replayed event: counted once already
    since = state["since"].get(key, 0)
    ids[block.event_id] = block.ts_ms
    newest = max(ids.values())
    live = {i: t for i, t in ids.items() if t > newest - rules.window_ms and t > since}
    if len(live) > rules.keep:
        live = dict(sorted(live.items(), key=lambda kv: (kv[1], kv[0]))[-rules.keep:])
    state["windows"][key] = live
    if block.event_id not in live or len(live) < rules.blocks:
        return None
    last = state["quarantines"].get(key)
    if last is not None and block.ts_ms < last[1]:
        return None  # already quarantined: not issued again while it lasts
    at, until = block.ts_ms, block.ts_ms + rules.quarantine_ms
    second = any(k != key and k.startswith(f"{scope}|") and q[0] < at
                 and at - q[0] < rules.window_ms
                 for k, q in state["quarantines"].items())
    state["quarantines"][key] = [at, until]
    state["since"][key] = at
    reason = (f"{len(live)} blocks within {rules.window_ms // 1000}s for {scope} {name} on "
              f"{block.target}")
    return Issued(Quarantine(scope, block.target, name, until, reason), at, second,
                  len(live), block.event_id)


def _target_pause(state: QuarantineCounts, block: Block, rules: Rules,
                  allowed: Collection[str]) -> Issued | None:
    if not allowed:
        return None
    key = scope_key("target", "")
    last = state["quarantines"].get(key)
    now = block.ts_ms
    if last is not None and now < last[1]:
        return None
    out = sorted(p for p in allowed
                 if (q := state["quarantines"].get(scope_key("profile", p))) is not None
                 and q[0] <= now < q[1])
    if len(out) <= rules.target_share * len(allowed):
        return None
    until = now + rules.quarantine_ms
    state["quarantines"][key] = [now, until]
    reason = (f"{len(out)} of {len(allowed)} profiles quarantined ({', '.join(out)}): the "
              "target is paused instead of burning the rest")
    return Issued(Quarantine("target", block.target, "", until, reason), now, False,
                  len(out), block.event_id)


def prune(state: QuarantineCounts, now_ms: int, rules: Rules) -> None:
    """Drop what can no longer matter at event time ``now_ms``: ids out of the window,
    quarantines over and older than the window (no longer a neighbour to cascade from)."""
    for key, ids in list(state["windows"].items()):
        live = {i: t for i, t in ids.items() if t > now_ms - rules.window_ms}
        if live:
            state["windows"][key] = live
        else:
            del state["windows"][key]
    for key, (at, until) in list(state["quarantines"].items()):
        if now_ms >= until and now_ms - at >= rules.window_ms:
            del state["quarantines"][key]
    for key, at in list(state["since"].items()):
        if key not in state["quarantines"] and now_ms - at >= rules.window_ms:
            del state["since"][key]


def is_empty(state: QuarantineCounts) -> bool:
    """Nothing left worth keeping: the table drops the target (a tombstone)."""
    return not (state["windows"] or state["since"] or state["quarantines"])


def active(state: QuarantineCounts, now_ms: int) -> int:
    """Quarantines of this target in force at ``now_ms``."""
    return sum(1 for at, until in state["quarantines"].values() if at <= now_ms < until)
