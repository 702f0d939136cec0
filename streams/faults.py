"""Fault injection points for fault tests: a worker can be told to fail at a precise moment.

``CRAWLFLEET_FAULT=<point>[:<n>]`` acts the n-th time (default 1st) the process reaches
``<point>``; ``<point>:%<n>`` every n-th time. Points where the process exits abruptly
(``os._exit(137)``, as ``kill -9`` would):

- ``before_commit``: outputs produced inside the transaction, commit not yet sent;
- ``after_commit``: transaction committed, the worker has not yet acted on it (lost ack);
- ``after_insert``: store stage inserted a batch into ClickHouse, offsets not committed;
- ``after_warc``: store stage wrote a batch's pages to its WARC files (``warc_dir``) and
  fsynced them, offsets not committed (a batch without pages does not count).

And one where it lives on, and the commit fails as a slow or failing broker makes it fail
(the path a kill never reaches):

- ``abort_commit``: the transaction is aborted instead of committed (an abortable error);
- ``abort_handover``: the commit an asyncio stage (fetch) makes inside a revocation, handing
  its finished work over before the partitions move, fails (as a generation that moved on
  makes it fail, ILLEGAL_GENERATION), whether or not it had work to hand over.

And one where the store stage lives on and its write fails as a ClickHouse server that lost
a replica (or its quorum) makes it fail:

- ``store_unavailable``: the batch's first table is inserted, the rest raise
  ``StoreUnavailableError``; the offsets stay uncommitted and the worker waits and rejoins.

And ones where it lives on and a commit stalls, as a transactional call does that librdkafka
does not return from while its coordinator moved (librdkafka#5456, after brokers restart):

- ``stall_commit``: the commit blocks for ``CRAWLFLEET_FAULT_STALL_S`` seconds (default
  30) before sending its offsets; the worker's event loop, its requests and its status
  go on meanwhile;
- ``stall_offsets``: the commit takes its consumer's group metadata, then blocks as long
  before sending its offsets with it: a member that joins meanwhile moves the group's
  generation on, and the offsets are refused (ILLEGAL_GENERATION) as a slow commit's are.

Unset (the default), every call is a dictionary lookup and nothing else.
"""

from __future__ import annotations

import os
import sys
import time

ENV = "CRAWLFLEET_FAULT"
STALL_ENV = "CRAWLFLEET_FAULT_STALL_S"
_counts: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int, bool]:
    """(point, n, every n-th) of a fault spec."""
    point, _, nth = spec.partition(":")
    every = nth.startswith("%")
    nth = nth.lstrip("%")
    return point, max(1, int(nth)) if nth.isdigit() else 1, every


_TARGET = _parse(os.environ[ENV]) if os.environ.get(ENV) else None


def _hit(name: str) -> bool:
    if _TARGET is None or _TARGET[0] != name:
        return False
    _counts[name] = _counts.get(name, 0) + 1
    n = _counts[name]
    return n % _TARGET[1] == 0 if _TARGET[2] else n == _TARGET[1]


def point(name: str) -> None:
    """Die here if this process was told to (see module docstring)."""
    if _hit(name):
        sys.stderr.write(f"crawlfleet fault injection: dying at {name} #{_counts[name]}\n")
        sys.stderr.flush()
        os._exit(137)


def fails(name: str) -> bool:
    """True if the operation at ``name`` must fail here (the caller raises its own error)."""
    if not _hit(name):
        return False
    sys.stderr.write(f"crawlfleet fault injection: failing {name} #{_counts[name]}\n")
    sys.stderr.flush()
    return True


def stall(name: str) -> None:
    """Block here for ``CRAWLFLEET_FAULT_STALL_S`` seconds if this process was told to."""
    if _hit(name):
        seconds = float(os.environ.get(STALL_ENV, "30"))
        sys.stderr.write(f"crawlfleet fault injection: stalling {name} #{_counts[name]} "
                         f"for {seconds:.0f}s\n")
        sys.stderr.flush()
        time.sleep(seconds)
