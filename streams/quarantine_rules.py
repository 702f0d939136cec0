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
- a block has two suspects, its profile and its egress: where the other side had a choice
  (a profile with several egresses, an egress several profiles use) the N blocks must come
  through at least two of it before the scope takes the blame (:func:`spread_needed`);
- a quarantine within W after a neighbour of the same kind (another profile, another
  egress) of the same target was quarantined is *second order*: a cascade, the figure the
  dashboard counts;
- when more than ``target_share`` of the profiles allowed for the target are quarantined,
  the whole target is quarantined (paused) instead of burning the rest.

Event times, never this process's clock: a replay computes exactly what the first run did.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from schemas.records import QuarantineCounts
from streams.control import Quarantine

#: Separates an event id from the block's other suspect in a window's entries.
_SEP = "\x1f"
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
            allowed_profiles: Collection[str],
            pools: Mapping[str, Collection[str]] | None = None) -> list[Issued]:
    """Fold one block into its target's ``state`` (in place); the quarantines it issues.

    ``allowed_profiles`` are the profiles configured for the target (``Profile.allowed_for``):
    the target pauses when more than ``rules.target_share`` of them are quarantined.
    ``pools`` (profile -> its egresses) decides whom a block is blamed on, see
    :func:`spread_needed`; without it every block counts for both.
    """
    out: list[Issued] = []
    names = {"profile": block.profile, "egress": block.egress}
    other = {"profile": block.egress, "egress": block.profile}
    for scope in COUNTED:
        name = names[scope]
        if not name:
            continue
        need = spread_needed(scope, name, allowed_profiles, pools)
        issued = _count(state, scope, name, block, rules, other[scope], need)
        if issued is not None:
            out.append(issued)
    if out:
        paused = _target_pause(state, block, rules, allowed_profiles, pools)
        if paused is not None:
            out.append(paused)
    prune(state, block.ts_ms, rules)
    return out


def spread_needed(scope: str, name: str, allowed_profiles: Collection[str],
                  pools: Mapping[str, Collection[str]] | None) -> int:
    """How many distinct counterparts the N blocks of a scope must come from.

    A block has two suspects: its profile and its egress. Blocks of one profile through
    one egress say nothing about which of the two the site refuses, so where the other
    side has a choice the blame needs both of it: a profile whose pool has several
    egresses is quarantined only for blocks through at least two of them, and an egress
    several of the target's profiles use only for blocks of at least two profiles. (Else
    one banned profile on a one-egress pool would also retire that egress for everyone.)
    """
    if pools is None:
        return 1
    if scope == "profile":
        return 2 if len(pools.get(name, ())) >= 2 else 1
    users = sum(1 for p in allowed_profiles if name in pools.get(p, ()))
    return 2 if users >= 2 else 1


def _count(state: QuarantineCounts, scope: str, name: str, block: Block,
           rules: Rules, other: str = "", need: int = 1) -> Issued | None:
    key = scope_key(scope, name)
    ids = state["windows"].setdefault(key, {})
    # The id carries the block's other suspect (an event has exactly one): still one entry
    # per distinct event, so a replay finds it.
    entry = f"{block.event_id}{_SEP}{other}"
    if entry in ids:
        return None  # a replayed event: counted once already
    since = state["since"].get(key, 0)
    ids[entry] = block.ts_ms
    newest = max(ids.values())
    live = {i: t for i, t in ids.items() if t > newest - rules.window_ms and t > since}
    if len(live) > rules.keep:
        live = dict(sorted(live.items(), key=lambda kv: (kv[1], kv[0]))[-rules.keep:])
    state["windows"][key] = live
    if entry not in live or len(live) < rules.blocks:
        return None
    if len({i.rpartition(_SEP)[2] for i in live}) < need:
        return None  # not yet attributable to this scope rather than its counterparts
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
                  allowed: Collection[str],
                  pools: Mapping[str, Collection[str]] | None = None) -> Issued | None:
    """The target's pause, when more than ``target_share`` of its profiles are out: each
    quarantined itself, or left without an egress (every egress of its pool quarantined
    for the target: a site refusing everything looks like one refusing our only exit)."""
    if not allowed:
        return None
    key = scope_key("target", "")
    last = state["quarantines"].get(key)
    now = block.ts_ms
    if last is not None and now < last[1]:
        return None

    def in_force(scope: str, name: str) -> bool:
        q = state["quarantines"].get(scope_key(scope, name))
        return q is not None and q[0] <= now < q[1]

    out = sorted(p for p in allowed if in_force("profile", p) or (
        pools is not None and bool(pools.get(p)) and all(in_force("egress", e)
                                                         for e in pools[p])))
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
