"""WARC file names and the cut that keeps them exactly-once (pure file operations).

Files are per input partition of ``crawl.parsed`` and per store worker, named by the
offsets they hold::

    {topic}+{partition}+{first:012d}-{last:012d}+{worker}.warc.gz    finished
    {topic}+{partition}+{first:012d}+{worker}.warc.gz.open           being written

``first`` and ``last`` are the input offsets of the first and last page in the file; every
record names its own (``Crawlfleet-Source``). :func:`cut` makes a partition's files hold
only pages before an offset: files that start at or past it are removed, a file that runs
past it is truncated at the first record at or past it (a torn record at its end -- a
write cut short by a kill -- goes too) and finished under the name of what it keeps.

Finding that record means inflating the file up to it (gzip members carry no length): ~56
MB/s, 19 s for a 1 GiB file. A file being written has a hint beside it
(``{topic}+{partition}+{first}+{worker}.warc.idx``: each page's input offset and byte
position), from which a cut inflates only the tail; the hint is checked against the member
it names, and a hint that does not match (or is missing) means a scan from the start.
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from consumers.warc.records import SOURCE

_NAME = re.compile(r"^(?P<topic>[A-Za-z0-9._-]+)\+(?P<partition>\d+)\+(?P<first>\d+)"
                   r"(?:-(?P<last>\d+))?\+(?P<worker>[A-Za-z0-9._-]+)\.warc\.gz(?P<open>\.open)?$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_READ = 1 << 20


@dataclass(frozen=True)
class WarcName:
    topic: str
    partition: int
    first: int
    worker: str
    last: int | None = None  # None: still being written

    @property
    def file_name(self) -> str:
        head = f"{self.topic}+{self.partition}+{self.first:012d}"
        if self.last is None:
            return f"{head}+{self.worker}.warc.gz.open"
        return f"{head}-{self.last:012d}+{self.worker}.warc.gz"

    @property
    def key(self) -> str:
        """The file's identity while it is written (its warcinfo record's id)."""
        return f"{self.topic}+{self.partition}+{self.first}+{self.worker}"

    @property
    def hint_name(self) -> str:
        return f"{self.key}.warc.idx"

    def finished(self, last: int) -> WarcName:
        return WarcName(self.topic, self.partition, self.first, self.worker, last)


def safe_worker(worker: str) -> str:
    """A worker id as a file name part (``+`` and ``/`` never appear in it)."""
    return _UNSAFE.sub("_", worker) or "_"


def parse_name(name: str) -> WarcName | None:
    m = _NAME.match(name)
    if m is None or (m["open"] is None) != (m["last"] is not None):
        return None
    return WarcName(m["topic"], int(m["partition"]), int(m["first"]), m["worker"],
                    None if m["last"] is None else int(m["last"]))


def partition_files(directory: Path, topic: str, partition: int) -> list[tuple[Path, WarcName]]:
    """Every WARC file of one input partition, any worker's, in order of first offset."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            name = parse_name(entry.name)
            if name is not None and name.topic == topic and name.partition == partition:
                out.append((Path(entry.path), name))
    return sorted(out, key=lambda f: (f[1].first, f[1].worker))


def members(path: Path, start: int = 0) -> Iterator[tuple[int, int, int | None]]:
    """Each complete gzip member of a file from byte ``start``: (start, end, source offset
    of its record or None). Stops at the first member that is torn or corrupt."""
    with path.open("rb") as f:
        f.seek(start)
        pos, buf = start, b""
        while True:
            start, head, d = pos, b"", zlib.decompressobj(31)
            while not d.eof:
                if not buf:
                    buf = f.read(_READ)
                    if not buf:
                        return
                try:
                    data = d.decompress(buf)
                except zlib.error:
                    return
                if len(head) < 8192:
                    head += data[:8192]
                used = len(buf) - len(d.unused_data) if d.eof else len(buf)
                pos, buf = pos + used, d.unused_data if d.eof else b""
            yield start, pos, source_offset(head)


def source_offset(head: bytes) -> int | None:
    """The input offset a record's ``Crawlfleet-Source`` names (None: a warcinfo)."""
    block = head.split(b"\r\n\r\n", 1)[0]
    for line in block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().decode("ascii", "replace") == SOURCE:
            return int(value.strip().rsplit(b":", 1)[-1])
    return None


def cut(directory: Path, topic: str, partition: int, offset: int) -> int:
    """Make the partition's files hold pages before ``offset`` only (see the module's
    docstring); every file of it is finished after. The records removed: what a replay
    from ``offset`` writes again. Durable (fsync) before it returns."""
    removed = 0
    for path, name in partition_files(directory, topic, partition):
        if name.first >= offset:
            removed += sum(1 for _, _, src in members(path) if src is not None)
            path.unlink()
            (directory / name.hint_name).unlink(missing_ok=True)
            continue
        if name.last is not None and name.last < offset:
            continue
        # records are in offset order: keep those before the first at or past the cut
        size, past = path.stat().st_size, False
        keep_end, last = resume_point(path, name, offset)
        for _start, end, src in members(path, keep_end):
            past = past or (src is not None and src >= offset)
            if past:
                removed += 1
                continue
            keep_end, last = end, src if src is not None else last
        if keep_end < size:
            with path.open("r+b") as f:
                f.truncate(keep_end)
                f.flush()
                os.fsync(f.fileno())
        (directory / name.hint_name).unlink(missing_ok=True)
        if last is None:
            path.unlink()
        else:
            final = path.with_name(name.finished(last).file_name)
            if final != path:
                path.rename(final)
    fsync_dir(directory)
    return removed


def resume_point(path: Path, name: WarcName, offset: int) -> tuple[int, int | None]:
    """Where a cut at ``offset`` may start reading the file, and the last page before that
    point: from the hint, the position of the last hinted page before the cut (checked: a
    member of that page starts there); else the file's start."""
    hinted: list[tuple[int, int]] = []
    with contextlib.suppress(OSError, ValueError):
        text = (path.parent / name.hint_name).read_text()
        hinted = [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines()
                                                 if line.count(" ") == 1)]
    before = [(o, p) for o, p in hinted if o < offset]
    if not before:
        return 0, None
    page, position = max(before)
    first = next(members(path, position), None)
    if first is None or first[0] != position or first[2] != page:
        return 0, None  # a stale or torn hint: read it all
    earlier = [o for o, _ in before if o < page]
    return position, max(earlier) if earlier else None


def fsync_dir(directory: Path) -> None:
    """Make a directory's creates, renames and removals durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
