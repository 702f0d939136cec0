"""What makes a stored row survive a lost replica on a ClickHouse cluster, from the Settings.

Kafka acknowledges a record once ``min.insync.replicas`` (2) brokers have it; the store
commits a batch's offsets once its insert returned. Without a quorum that insert is
acknowledged by one replica, and a lost disk loses rows whose offsets are already gone.
So on a cluster every store insert carries

- ``insert_quorum = 'auto'``: the majority of the shard's replicas must have the block before
  the insert returns. With 2 replicas per shard that is both (a second copy before the
  offsets move: an acknowledged insert survives one replica); with 3 it is 2, and inserts go
  on through one replica down. A fixed ``2`` would ask for a replica that a 1-replica test
  cluster does not have and stay short of a majority on 5; ``auto`` never asks for more
  replicas than the shard has;
- ``insert_quorum_parallel = 1``: quorum inserts from several store workers run side by side
  (each is still confirmed by the majority; only ``select_sequential_consistency`` reads lose
  their meaning, and nothing here uses them);
- ``insert_quorum_timeout`` below the client's timeout, so a slow replica answers with a
  ClickHouse error (retried by the store) before the client gives up on the request.

With a replica of a 2-replica shard down, the quorum cannot be met: the insert fails, the
batch's offsets are not committed, the store worker waits (``store_waiting``) and tries again,
and Kafka keeps the records meanwhile -- no write is acknowledged that one replica holds.

Replicated tables drop a repeated block by its ``insert_deduplication_token`` only while the
token is among the last ``replicated_deduplication_window`` blocks and no older than
``replicated_deduplication_window_seconds`` (measured from the newest block): both are set
explicitly on every replicated table (:func:`dedup_window`), longer than the longest time a
store batch can be sent again (:func:`store_retry_horizon_s`), instead of the server defaults
that changed across versions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.config import Settings

#: The store's tables an insert batch writes (one block per table, per shard, per batch).
STORE_TABLES = 6
#: No new record for this long cuts a store batch short (the store stage's quiet cut): with
#: the batch wait it bounds how often one store worker inserts (see :func:`dedup_window`).
STORE_QUIET_S = 0.15
#: Store workers the windows are sized for by default: the deployment's store replicas.
DEFAULT_STORE_WORKERS = 2


def store_retry_horizon_s(s: Settings) -> float:
    """The longest a store batch's block can be sent again after it first reached a replica.

    A batch is written, then its offsets are committed; a failure between the two replays it
    from the committed offsets, by this worker (its session ends and it rejoins) or by the
    next owner of its partitions. The slowest such replay: the batch took its whole lease
    (``max_poll_interval_ms``) and the worker was evicted or died, its partitions moved after
    ``session_timeout_ms``, and the new owner filled its batch (``store_batch_wait_s``) and
    wrote every table, each insert given at most ``clickhouse_timeout_s``. With the defaults:
    300 + 30 + 0.25 + 6 x 30 = 510.25 s.
    """
    return (s.max_poll_interval_ms / 1000.0 + s.session_timeout_ms / 1000.0
            + s.store_batch_wait_s + STORE_TABLES * s.clickhouse_timeout_s)


@dataclass(frozen=True)
class DedupWindow:
    """The replicated deduplication windows of every replicated table."""

    blocks: int
    seconds: int

    def table_settings(self) -> str:
        return (f"replicated_deduplication_window = {self.blocks}, "
                f"replicated_deduplication_window_seconds = {self.seconds}")


def dedup_window(s: Settings, store_workers: int = DEFAULT_STORE_WORKERS) -> DedupWindow:
    """Windows longer than the retry horizon, in time and in blocks.

    Seconds: twice the horizon, rounded up to a minute (510.25 s -> 1,080 s by default).
    Blocks: how many one shard's table can receive in that time. A store worker inserts at
    most one block per table per batch, and a batch lasts at least its quiet cut or its wait,
    whichever is shorter (0.15 s), unless it fills ``store_batch_rows`` first (5,000 records
    in 0.15 s: 33,000 records/s, ten times what one store worker was measured to handle).
    So 1,080 s / 0.15 s x 2 workers = 14,400 blocks by default.
    """
    if store_workers < 1:
        raise ValueError("store_workers must be >= 1")
    seconds = math.ceil(2 * store_retry_horizon_s(s) / 60.0) * 60
    shortest_batch_s = min(STORE_QUIET_S, s.store_batch_wait_s)
    blocks = math.ceil(round(seconds / shortest_batch_s, 6)) * store_workers
    return DedupWindow(blocks, seconds)


def insert_quorum_settings(s: Settings) -> dict[str, Any]:
    """Settings of every store insert on a cluster (see the module docstring)."""
    return {"insert_quorum": "auto", "insert_quorum_parallel": 1,
            # the server's answer comes before the client's own timeout
            "insert_quorum_timeout": int(s.clickhouse_timeout_s * 1000 * 3 / 4)}
