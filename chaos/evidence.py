"""What a failed round leaves behind, so the failure explains itself.

Written into the round's own folder (its ``data_dir``: the chDB store, the worker logs in
``logs/``, the status files and local state are already there) while the store and the
broker still run:

- ``report.txt`` / ``report.json``: the round's report and the checker's verdict;
- ``lineage.txt``: for each lost URL (the first :data:`TRACED`), its lineage from the store
  (``crawlfleet trace``: enqueued from which page, duplicate of which key, parked, fetched,
  retried, released, parsed, stored, dead) and from the broker (every committed record of it,
  topic by topic, and whether its parked or timer entry is still live or was tombstoned);
- ``lost_in_logs.txt``: the worker log lines that name a lost URL;
- ``broker-logs/``: the tail of each broker's ``server.log``.

The first few lost URLs' lineage is also printed, so a failure in CI says why at once; a
round that did not drain also says what its stuck workers logged last and, for one whose loop
stopped turning, where each of its threads stands (``py-spy dump``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from chaos.broker_trace import broker_lineage, lineage_lines
from chaos.report import ChaosReport, report_dict, report_text
from core.config import Settings
from core.errors import CrawlfleetError
from crawlfleet.trace import trace
from schemas.topics import Topology

#: Lost URLs whose lineage is written out (all are counted); the first PRINTED are shown.
TRACED = 20
PRINTED = 3
#: Bytes of each broker's server.log kept.
BROKER_LOG_TAIL = 4 * 1024 * 1024
LOG_LINES_PER_URL = 40


def keep_evidence(report: ChaosReport, settings: Settings, topo: Topology, kafka_home: Path,
                  console: Console) -> Path:
    """Write the round's evidence into its folder; the folder."""
    root = settings.data_dir
    root.mkdir(parents=True, exist_ok=True)
    (root / "report.txt").write_text(report_text(report))
    (root / "report.json").write_text(json.dumps(report_dict(report), indent=2, default=str)
                                      + "\n")
    lost = list(report.verdict.lost[:TRACED])
    lineage = lineage_text(settings, topo, lost)
    (root / "lineage.txt").write_text("\n".join(lineage) + "\n")
    (root / "lost_in_logs.txt").write_text(log_mentions(root / "logs", lost))
    _broker_logs(kafka_home, root / "broker-logs")
    shown = 0
    for line in lineage:
        if line.startswith("== "):
            shown += 1
            if shown > PRINTED:
                break
        console.print(line, markup=False, highlight=False)
    return root


def lineage_text(settings: Settings, topo: Topology, urls: list[str]) -> list[str]:
    """Each URL's lineage from the store's tables and from the broker's topics."""
    if not urls:
        return ["no lost URL"]
    try:
        on_broker = broker_lineage(settings, topo, urls)
    except CrawlfleetError as exc:
        on_broker = {}
        broker_error = f"broker: not readable ({exc})"
    else:
        broker_error = ""
    lines: list[str] = []
    for url in urls:
        lines.append(f"== {url}")
        try:
            events = trace(settings, url)
        except CrawlfleetError as exc:
            lines.append(f"store: lineage not readable ({exc})")
            events = []
        if not events:
            lines.append("store: no lineage event, fetch event, page or dead letter")
        for e in events:
            lines.append("store: " + "  ".join(x for x in e.row() if x))
        if broker_error:
            lines.append(broker_error)
        else:
            lines += lineage_lines(topo, on_broker.get(url, []))
    return lines


def log_mentions(log_dir: Path, urls: list[str]) -> str:
    """Lines of the worker logs that name one of ``urls``, per URL."""
    if not urls or not log_dir.is_dir():
        return ""
    out: list[str] = []
    logs = sorted(log_dir.rglob("*.log"))
    for url in urls:
        hits = []
        for log in logs:
            for line in log.read_text(errors="replace").splitlines():
                if url in line:
                    hits.append(f"{log.name}: {line}")
        out.append(f"== {url}: {len(hits)} line(s)")
        out += hits[:LOG_LINES_PER_URL]
    return "\n".join(out) + "\n"


def _broker_logs(kafka_home: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for log in sorted(kafka_home.glob("node-*/logs/server.log")):
        size = log.stat().st_size
        with log.open("rb") as fh:
            fh.seek(max(0, size - BROKER_LOG_TAIL))
            (into / f"{log.parent.parent.name}.log").write_bytes(fh.read())


def log_tail(log: Path, lines: int = 25) -> list[str]:
    """The last ``lines`` lines of a worker's log that are its own (librdkafka's
    connection chatter, ``%N|…``, left out: a broker restart floods the log with it)."""
    try:
        with log.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 256 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return [f"(no log: {exc})"]
    own = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("%")]
    return own[-lines:]


def stack_dump(pid: int, timeout_s: float = 30.0) -> list[str]:
    """Where every thread of the live process ``pid`` stands (``py-spy dump``), for a worker
    whose loop stopped turning: the call it is stuck in is the finding."""
    beside = Path(sys.executable).with_name("py-spy")  # the venv's, from the dev extra
    spy = str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"
    try:
        out = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"(no stack dump: {exc})"]
    text = out.stdout if out.returncode == 0 else f"(py-spy failed: {out.stderr.strip()[:300]})"
    return [ln for ln in text.splitlines() if ln.strip()][:80]


def stuck_notes(stuck: list[str], silent: set[str], log_dir: Path,
                pids: dict[str, int]) -> list[str]:
    """One note per stuck worker: its log's last lines, and its stacks if it is silent."""
    notes = []
    for wid in stuck:
        tail = log_tail(log_dir / f"{wid}.log")
        note = f"{wid}'s log, last {len(tail)} lines of its own:\n  " + "\n  ".join(tail)
        if wid in silent and wid in pids:
            note += "\n" + f"{wid}'s threads (py-spy dump):\n  " + "\n  ".join(
                stack_dump(pids[wid]))
        notes.append(note)
    return notes
