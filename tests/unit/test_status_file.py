"""A worker's status file: rate-limited, except the moment the worker puts its last work
down -- the crawl decides "drained" from these files (with the broker), and a file left
showing queued work for half a second was that much of every crawl's drain."""

from __future__ import annotations

import json
import time
from pathlib import Path

from streams.status import IDLE_WRITE_EVERY_S, StatusFile


def _on_disk(status: StatusFile) -> dict[str, int]:
    gauges: dict[str, int] = json.loads(status.path.read_text())["gauges"]
    return gauges


def test_going_idle_is_written_at_once(tmp_path: Path) -> None:
    status = StatusFile(tmp_path, "fetch", "fetch-0")
    status.gauges.update(queued=43, inflight=2)
    status.write(force=True)
    status.gauges.update(queued=0, inflight=0)
    time.sleep(IDLE_WRITE_EVERY_S * 1.5)
    status.write()  # well inside the usual half second
    assert _on_disk(status)["queued"] == 0 and _on_disk(status)["inflight"] == 0


def test_busy_changes_stay_rate_limited(tmp_path: Path) -> None:
    status = StatusFile(tmp_path, "fetch", "fetch-0")
    status.gauges.update(queued=43)
    status.write(force=True)
    status.gauges.update(queued=12)
    time.sleep(IDLE_WRITE_EVERY_S * 1.5)
    status.write()
    assert _on_disk(status)["queued"] == 43  # still holding work: the next regular write
    # Idle from the start (nothing held at the last write): no extra writes either.
    idle = StatusFile(tmp_path, "parse", "parse-0")
    idle.gauges.update(seen_keys=1)
    idle.write(force=True)
    idle.gauges.update(seen_keys=2)
    time.sleep(IDLE_WRITE_EVERY_S * 1.5)
    idle.write()
    assert _on_disk(idle)["seen_keys"] == 1
