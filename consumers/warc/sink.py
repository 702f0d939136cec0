"""The store's WARC sink: every stored page in a WARC file, exactly once across kills.

The store stage writes a batch's rows, then commits the batch's input offsets; a kill
between the two replays the batch from the committed offsets (``consumers.store``). The sink
joins that contract with one rule each way:

1. **Durable before the commit.** A batch's records are appended to its partition's open
   file and fsynced inside the store's write, before the offsets are committed: a committed
   page is always on disk.
2. **Cut where the input goes back.** Whenever a partition's input starts (a worker's
   start, a new session, a partition assigned after a rebalance) or goes back (a replay),
   the first page the sink is given is at the committed offset -- nothing between them is
   a page. Every file of that partition, any worker's in the shared directory, is first
   cut there (``consumers.warc.files.cut``): what was written past the last commit is
   removed, and the replay writes it again, byte for byte the same (records carry no
   clock and no random id: ``consumers.warc.records``).

So a page is never lost (1) and never written twice (2): the records on disk are always
exactly the committed pages, plus those of the batch being written. A file is finished
(renamed from ``.open`` to its offset range, fsynced) when it passes ``warc_max_bytes``,
when its partition is revoked, at a cut and when the worker stops; a finished file may still
be cut if it holds pages past the last commit (a kill right after a rotation).

Shared directory: store workers that take over each other's partitions must see one
directory (one store worker, as with the embedded store, needs nothing). Left open: a
worker frozen past its session timeout in the instant between its append and its commit,
then killed, leaves its append on disk after the new owner's cut.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from consumers.warc.files import WarcName, cut, fsync_dir, safe_worker
from consumers.warc.records import page_records, warcinfo
from consumers.warc.refs import warc_date
from schemas.records import ParsedPage

log = logging.getLogger("crawlfleet.warc")

#: One page of a batch: (topic, partition, offset, the page).
Placed = tuple[str, int, int, ParsedPage]


@dataclass
class _Open:
    name: WarcName
    path: Path
    f: BinaryIO
    size: int
    last: int
    hint: list[str]  # "offset position" of the pages appended since the last sync


class WarcSink:
    """Per store worker: one open file per input partition, rotated by size."""

    def __init__(self, directory: Path, max_bytes: int, worker: str) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.worker = safe_worker(worker)
        directory.mkdir(parents=True, exist_ok=True)
        self._open: dict[tuple[str, int], _Open] = {}
        #: The offset after the last page written per partition in this tenure.
        self._next: dict[tuple[str, int], int] = {}
        self.records_cut = 0

    def write(self, pages: list[Placed]) -> int:
        """Append ``pages`` (in input order per partition) and fsync: the bytes written."""
        written = 0
        touched: set[tuple[str, int]] = set()
        for topic, partition, offset, page in pages:
            tp = (topic, partition)
            if offset < self._next.get(tp, -1) or tp not in self._next:
                self._finish(tp)
                removed = cut(self.directory, topic, partition, offset)
                self.records_cut += removed
                if removed:
                    log.info("warc: %s:%d written again from offset %d: %d records past the "
                             "last commit removed first", topic, partition, offset, removed)
            data = page_records(page, f"{topic}:{partition}:{offset}")
            opened = self._file(tp, offset, page)
            opened.hint.append(f"{offset} {opened.size}\n")
            opened.f.write(data)
            opened.size += len(data)
            opened.last = offset
            self._next[tp] = offset + 1
            touched.add(tp)
            written += len(data)
        for tp in touched:
            if tp in self._open:
                self._sync(self._open[tp])
        return written

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        """The partitions left this worker (revoked, or the session ended): finish their
        files; their next pages start a new tenure (and a cut)."""
        for tp in partitions:
            self._finish(tp)
            self._next.pop(tp, None)

    def close(self) -> None:
        self.forget(list(self._next))

    def _file(self, tp: tuple[str, int], offset: int, page: ParsedPage) -> _Open:
        opened = self._open.get(tp)
        if opened is not None and opened.size < self.max_bytes:
            return opened
        self._finish(tp)
        name = WarcName(tp[0], tp[1], offset, self.worker)
        path = self.directory / name.file_name
        f = path.open("wb")
        head = warcinfo(name.key, warc_date(page["fetched_at_ms"]))
        f.write(head)
        fsync_dir(self.directory)
        (self.directory / name.hint_name).unlink(missing_ok=True)
        opened = _Open(name, path, f, len(head), offset, [])
        self._open[tp] = opened
        return opened

    def _sync(self, opened: _Open) -> None:
        opened.f.flush()
        os.fsync(opened.f.fileno())
        if opened.hint:  # a hint only (files.resume_point checks it): never fsynced
            with (self.directory / opened.name.hint_name).open("a") as h:
                h.writelines(opened.hint)
            opened.hint.clear()

    def _finish(self, tp: tuple[str, int]) -> None:
        opened = self._open.pop(tp, None)
        if opened is None:
            return
        self._sync(opened)
        opened.f.close()
        opened.path.rename(self.directory / opened.name.finished(opened.last).file_name)
        fsync_dir(self.directory)
        (self.directory / opened.name.hint_name).unlink(missing_ok=True)
