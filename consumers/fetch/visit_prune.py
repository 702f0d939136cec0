"""Which earlier visits' dedupe keys a revisit may drop (issue 45): pure, no store, no clock.

Each visit of a page has a dedupe key of its own (``schemas.keys.job_dedupe_key``: the page's
key, ``visit:n`` after it), so without pruning a page revisited every hour leaves 168 keys in
``crawl.seen`` before ``seen_ttl_s`` forgets the first. A key exists only to suppress a copy of
its job that is still in the system: a retry waiting on its timer, or a record redelivered
within a lease. None of those outlives the dedupe horizon (``Settings.dedupe_horizon_s``: the
retry horizon plus the longest lease, the bound ``seen_ttl_s`` is checked against), counted
from the key's write, which comes after every copy of the job was made. So when visit ``n``
writes its key, the keys of visits ``1 .. n-1`` older than the horizon are dropped (their
tombstones in the same transaction). Visit 0's key is never dropped: it is what keeps a link
to the page from starting it again as a new page.

Keys are written in visit order, so the live ones always form a run ending at the latest
visit (those still within the horizon, plus any that aged past it since the last prune): the
walk down from ``n-1`` stops at the first visit with no key, which the previous prunes (or the
TTL) already removed. A prune skipped (its key was young, the transaction aborted, the worker
died) is taken up by the next visit's: the rule reads only committed state, and dropping a key
twice is harmless, so it holds across kills and restarts.
"""

from __future__ import annotations

from collections.abc import Callable

#: Most earlier visits looked at per finished revisit: the live run is the visits within the
#: horizon (horizon / interval + 1, a handful at any sane interval), so this only bounds the
#: lookups of a page revisited far more often than its horizon (the TTL still drops the rest).
MAX_WALK = 256


def prunable_visits(visit: int, written_of: Callable[[int], float | None], now_s: float,
                    horizon_s: float, max_walk: int = MAX_WALK) -> list[int]:
    """The earlier visits of a page (never 0) whose keys visit ``visit`` may drop.

    ``written_of(k)``: when visit ``k``'s key was written (epoch seconds), None if it has
    none. A key is dropped once it is strictly older than ``horizon_s``; a younger one is
    kept (a copy of its job may still come) and the walk goes on below it.
    """
    out: list[int] = []
    for k in range(visit - 1, max(0, visit - 1 - max_walk), -1):
        written = written_of(k)
        if written is None:
            break
        if now_s - written > horizon_s:
            out.append(k)
    return out
