"""Opening a declared store: its directory, its RocksDB tuning, its TTL, from the declaration.

The runtime opens every store a stage declares (``StoreDecl``): this module is the one place
a :class:`~streams.state_store.StateStore` is made for a stage. A declaration names its
tuning:

- ``default``: small memtables, lz4 (:func:`streams.state_store.default_options`): parked
  queues, timers, most stores;
- ``large``: for many keys (the fetch stage's dedupe store, millions of keys). Memory does
  not grow with the key count: one small LRU block cache per store (shared by its
  partitions) holds data, index and filter blocks; memtables are bounded by a write-buffer
  manager charged to that cache. Index and bloom filters are *partitioned*: a monolithic
  filter of a few MB is larger than one shard of a 16 MB sharded cache, so it would be
  re-read on every get (we measured ~70x slower gets at 2M keys). Small SST files bound
  what a compaction builds in memory.

A store with ``ttl_setting`` expires its entries after that setting's seconds, as its
changelog forgets them; the stage's value layout says when a value was written
(``written_of``).
"""

from __future__ import annotations

from pathlib import Path

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    WriteBufferManager,
)

from core.config import Settings
from schemas.stages import StoreDecl
from streams.state_store import StateStore, WrittenOf, store_dir

#: Memory budget of one store (all its partitions): block cache, with memtables charged to it.
BLOCK_CACHE_BYTES = 16 * 1024 * 1024
WRITE_BUFFER_BYTES = 8 * 1024 * 1024  # total memtable budget of the store (inside the cache)
MEMTABLE_BYTES = 4 * 1024 * 1024  # one memtable of one partition
TARGET_FILE_BYTES = 8 * 1024 * 1024  # SST size: a compaction holds one file's index/filter
LEVEL_BASE_BYTES = 32 * 1024 * 1024  # levels form early: a flush is not merged into everything


def _large_options(cache: Cache, wbm: WriteBufferManager) -> Options:
    """RocksDB options of a large store's DBs: ``cache`` and ``wbm`` are shared by all of
    a store's partitions (see the module docstring)."""
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_bloom_filter(10, False)  # full filter, ~1% false positives: cheap misses
    table.set_cache_index_and_filter_blocks(True)  # index/filters live in the cache too
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)  # only the small top level stays pinned
    table.set_pin_top_level_index_and_filter(True)
    table.set_format_version(5)
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_manager(wbm)
    opts.set_write_buffer_size(MEMTABLE_BYTES)
    opts.set_max_write_buffer_number(2)
    opts.set_compression_type(DBCompressionType.lz4())
    opts.set_bottommost_compression_type(DBCompressionType.zstd())
    opts.set_level_compaction_dynamic_level_bytes(True)
    opts.set_max_background_jobs(2)
    opts.set_target_file_size_base(TARGET_FILE_BYTES)
    opts.set_max_bytes_for_level_base(LEVEL_BASE_BYTES)
    opts.set_max_open_files(256)
    opts.set_keep_log_file_num(2)  # every open rolls RocksDB's info LOG
    opts.set_max_log_file_size(1024 * 1024)
    return opts


def open_store(name: str, directory: Path | None = None, *, tuning: str = "default",
               format_tag: bytes | None = None, ttl_s: float | None = None,
               written_of: WrittenOf | None = None) -> StateStore:
    """A store named ``name`` in ``directory`` (a temporary one if None) with ``tuning``."""
    if tuning == "default":
        return StateStore(name, directory, format_tag=format_tag, ttl_s=ttl_s,
                          written_of=written_of)
    if tuning != "large":
        raise ValueError(f"{name} store: unknown tuning {tuning!r} (default, large)")
    cache = Cache(BLOCK_CACHE_BYTES)
    wbm = WriteBufferManager.new_write_buffer_manager_with_cache(WRITE_BUFFER_BYTES, False,
                                                                 cache)
    store = StateStore(name, directory, options=_large_options(cache, wbm),
                       format_tag=format_tag, ttl_s=ttl_s, written_of=written_of)
    store.keep_alive = (cache, wbm)  # shared by every partition's DB while it is open
    return store


def open_declared(decl: StoreDecl, settings: Settings, worker: str, *,
                  format_tag: bytes | None = None,
                  written_of: WrittenOf | None = None) -> StateStore:
    """The store ``decl`` of ``worker``, where the runtime keeps it, tuned as declared."""
    ttl_s = float(getattr(settings, decl.ttl_setting)) if decl.ttl_setting else None
    return open_store(decl.name, store_dir(settings, decl.name, worker), tuning=decl.tuning,
                      format_tag=format_tag, ttl_s=ttl_s, written_of=written_of)
