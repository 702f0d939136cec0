"""Fault injection points for fault tests: a worker can be told to die at a precise moment.

``CRAWLFLEET_FAULT=<point>[:<n>]`` makes the process exit abruptly (``os._exit(137)``, as
``kill -9`` would) the n-th time (default 1st) it reaches ``<point>``. Points:

- ``before_commit``: outputs produced inside the transaction, commit not yet sent;
- ``after_commit``: transaction committed, the worker has not yet acted on it (lost ack);
- ``after_insert``: store stage inserted a batch into ClickHouse, offsets not committed.

Unset (the default), every call is a dictionary lookup and nothing else.
"""

from __future__ import annotations

import os
import sys

ENV = "CRAWLFLEET_FAULT"
_counts: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int]:
    point, _, nth = spec.partition(":")
    return point, int(nth) if nth.isdigit() else 1


_TARGET = _parse(os.environ[ENV]) if os.environ.get(ENV) else None


def point(name: str) -> None:
    """Die here if this process was told to (see module docstring)."""
    if _TARGET is None or _TARGET[0] != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == _TARGET[1]:
        sys.stderr.write(f"crawlfleet fault injection: dying at {name} #{_counts[name]}\n")
        sys.stderr.flush()
        os._exit(137)
