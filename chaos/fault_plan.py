"""Which faults a chaos round injects, and when: pure choices from a seeded RNG.

A soak is only as good as its coverage: every fault type must be hit many times on one
commit, across runs of at most an hour. So the heavy faults of a round (everything but the
steady worker kills) are dealt *least-hit first*: the kinds the results file has counted
least often on this commit come up next, ties broken by the RNG. A soak resumed in a later
session therefore fills in the kinds the earlier pieces hit least, instead of starting a
fresh shuffle.

Worker kills run through every round on a timer; their victims follow a shuffled cycle of
the stages (every stage, the store included, is hit before any is hit twice). Heavy faults
fire at shares of the pages requested (progress), not at clock times: a round crawls at
whatever pace the machine allows, and a fault must land while work is in flight.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.stages import stage_spec, stages

WORKER_KILL = "worker_kill"  # kill -9 of one stage worker; the fleet restarts it
BROKER_KILL = "broker_kill"  # kill -9 of one broker, restarted after a while
BROKER_FREEZE = "broker_freeze"  # SIGSTOP of one broker past the session timeout, SIGCONT
RESTART_ALL = "restart_all"  # every broker killed at once, all started again
STORE_RESTART = "store_restart"  # kill -9 of the store worker while readers query it
STATE_WIPE = "state_wipe"  # kill -9 of a fetch or retry worker, its local state deleted
#: every broker stopped cleanly and started again, one after another, then every worker
#: of every stage: a deployment's rolling restart (not in the soak's mix: it is slow, and
#: its faults are the gentle ones of the others)
ROLLING_RESTART = "rolling_restart"

#: The faults a round mixes with its worker kills, each a scenario of its own.
HEAVY: tuple[str, ...] = (BROKER_KILL, BROKER_FREEZE, RESTART_ALL, STORE_RESTART, STATE_WIPE)
FAULT_KINDS: tuple[str, ...] = (WORKER_KILL, *HEAVY, ROLLING_RESTART)
#: Faults that need a second and third broker to leave the cluster serving.
NEEDS_THREE_NODES = frozenset({BROKER_KILL, BROKER_FREEZE})


def stateful_stages() -> tuple[str, ...]:
    """The stages with local state a wipe can delete: those that declare ``stores``
    (fetch: seen + parked; retry: timers; any declared stage's own)."""
    return tuple(st for st in stages() if stage_spec(st).state)

#: Heavy faults fire between these shares of the pages requested: late enough for work
#: to be in flight everywhere, early enough to recover under load, not in the tail.
FIRST_AT, LAST_AT = 0.15, 0.6


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    at_progress: float  # fires once this share of the expected pages has been requested


@dataclass(frozen=True)
class RoundPlan:
    index: int
    seed: int
    heavy: tuple[PlannedFault, ...]
    worker_kills: bool = True

    @property
    def kinds(self) -> tuple[str, ...]:
        return ((WORKER_KILL,) if self.worker_kills else ()) + tuple(f.kind for f in self.heavy)


def least_hit(counts: Mapping[str, int], kinds: Sequence[str], n: int,
              rng: random.Random) -> list[str]:
    """``n`` distinct kinds (all of them if fewer), those with the lowest counts first;
    among equal counts the RNG decides."""
    order = list(kinds)
    rng.shuffle(order)
    order.sort(key=lambda k: counts.get(k, 0))  # stable: the shuffle breaks ties
    return order[:n]


def progress_points(n: int, first: float = FIRST_AT, last: float = LAST_AT) -> list[float]:
    """``n`` trigger points spread evenly over ``[first, last]`` (one: ``first``)."""
    if n <= 0:
        return []
    if n == 1:
        return [first]
    step = (last - first) / (n - 1)
    return [round(first + i * step, 4) for i in range(n)]


def plan_round(index: int, seed: int, counts: Mapping[str, int], *, heavy_per_round: int,
               kinds: Sequence[str] = HEAVY, worker_kills: bool = True) -> RoundPlan:
    """Round ``index``'s faults: ``heavy_per_round`` least-hit heavy kinds (given what the
    results already count) at evenly spread progress points, in a seeded order."""
    rng = random.Random(seed * 1_000_003 + index)  # noqa: S311 - a reproducible schedule
    chosen = least_hit(counts, kinds, heavy_per_round, rng)
    rng.shuffle(chosen)
    points = progress_points(len(chosen))
    return RoundPlan(index=index, seed=seed, worker_kills=worker_kills,
                     heavy=tuple(PlannedFault(k, p) for k, p in zip(chosen, points, strict=True)))


def usable_kinds(nodes: int, kinds: Sequence[str] = HEAVY) -> tuple[str, ...]:
    """The heavy kinds a cluster of ``nodes`` can take and keep serving."""
    return tuple(k for k in kinds if nodes >= 3 or k not in NEEDS_THREE_NODES)


class StageCycle:
    """Victims of worker kills: a random worker of the next stage in a shuffled cycle of
    the stages, so every stage is hit before any is hit twice."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._cycle: list[str] = []

    def next_victim(self, workers: Sequence[str], stages: Sequence[str] | None = None) -> str:
        """A worker id (``<stage>-<n>``) from ``workers``, of a stage in ``stages`` if
        given (e.g. only the stateful ones)."""
        by_stage: dict[str, list[str]] = {}
        for wid in sorted(workers):
            stage = wid.rsplit("-", 1)[0]
            if stages is None or stage in stages:
                by_stage.setdefault(stage, []).append(wid)
        if not by_stage:
            raise ValueError(f"no worker of {stages} among {sorted(workers)}")
        self._cycle = [s for s in self._cycle if s in by_stage]
        if not self._cycle:
            self._cycle = sorted(by_stage)
            self.rng.shuffle(self._cycle)
        return self.rng.choice(by_stage[self._cycle.pop()])
