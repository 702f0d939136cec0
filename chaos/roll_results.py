"""The rolling-restart test's results: one JSON line a run, and README's table from them.

``tests/integration/test_rolling_restart.py`` appends one line per run (passed or failed) to
``bench/rolling_restart_results.jsonl`` (committed, as ``bench/soak_results.jsonl`` is; the
environment variable ``CRAWLFLEET_ROLL_RESULTS`` names another file, an empty value none):
the commit, the pages stored once of those reachable, duplicates and losses, the requests per
second the site served during each step of the roll, and the busiest host's most requests in
any 1-s window beside what politeness allows (cap + 1). ``python -m chaos.roll_results``
prints the Markdown table README shows (``--commit SHA`` keeps that commit's runs).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.report import ChaosReport, FaultRecord
from chaos.soak import REPO, append_result, git_commit, read_results

RESULTS_NAME = "bench/rolling_restart_results.jsonl"
RESULTS = REPO / RESULTS_NAME
ENV = "CRAWLFLEET_ROLL_RESULTS"


def results_path() -> Path | None:
    """Where a run is recorded: ``$CRAWLFLEET_ROLL_RESULTS`` if set (empty: nowhere)."""
    named = os.environ.get(ENV)
    if named is None:
        return RESULTS
    return Path(named) if named else None


def step_paces(detail: str) -> dict[str, float]:
    """``requests/s to the site per step: broker 1 9.8, fetch-0 10.2`` → {step: pace}."""
    if ": " not in detail:
        return {}
    steps = detail.split(": ", 1)[1].split(", ")
    return {s.rsplit(" ", 1)[0]: float(s.rsplit(" ", 1)[1]) for s in steps if " " in s}


def roll_line(report: ChaosReport, roll: FaultRecord, cap: float,
              commit: str | None = None) -> dict[str, Any]:
    """The run's line (``ok``/``failure`` are the test's to add once it has judged)."""
    v = report.verdict
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit if commit is not None else git_commit(REPO, RESULTS_NAME),
        "pages": report.pages, "hosts": report.hosts, "nodes": report.nodes,
        "fetch_workers": report.fetch_workers, "reachable": v.reachable,
        "stored_once": v.stored_once, "lost": report.lost,
        "duplicates": report.stored_duplicates, "final_duplicates": v.duplicates,
        "committed_duplicates": report.committed_duplicates,
        "over_apply": report.over_apply, "over_apply_bound": report.bound.used,
        "paces": step_paces(roll.detail), "roll_error": roll.error,
        "roll_started_s": roll.at_s, "roll_ended_s": roll.ended_at_s,
        "cap": cap, "cap_allowed": int(cap) + 1,
        "peak_host_requests": report.peak_host_requests, "peak_host": report.peak_host,
        "peak_window": [[t, path] for t, path in report.peak_window],
        "restarts_at_s": {k.worker: k.at_s for k in report.kills if k.cause == roll.kind},
        # the round's start, wall clock (to set the window beside the workers' logs)
        "t0_wall": next((round(k.wall - k.at_s, 3) for k in report.kills), None),
        "seconds": report.seconds, "crawl_seconds": report.crawl_seconds,
        "drained": report.drained,
        "load_1m": round(os.getloadavg()[0], 2),
    }


def record(line: Mapping[str, Any]) -> None:
    """Append ``line`` to the results file (none when ``$CRAWLFLEET_ROLL_RESULTS`` is empty)."""
    path = results_path()
    if path is not None:
        append_result(path, line)


def _paces(paces: Mapping[str, float], brokers: bool) -> str:
    vals = [p for step, p in paces.items() if step.startswith("broker") == brokers]
    if not vals:
        return "-"
    if brokers:
        return " / ".join(f"{p:.1f}" for p in vals)
    return f"{min(vals):.1f}-{max(vals):.1f}"


def markdown_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """One row per run: when, commit, pages stored once, duplicates, lost, the busiest
    host's most requests in 1 s against cap + 1, each broker step's pace and the workers'
    range, wall time, the machine's load, and whether the test passed."""
    out = ["| # | at (UTC) | commit | stored once | dup. | lost | peak req/host/1 s "
           "(allowed) | pace, broker steps (req/s) | pace, worker steps | wall s | load | "
           "passed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, r in enumerate(rows, 1):
        out.append(
            f"| {n} | {r['at'][:16].replace('T', ' ')} | `{r['commit'][:7]}` | "
            f"{r['stored_once']}/{r['reachable']} | {r['duplicates']} | {r['lost']} | "
            f"{r['peak_host_requests']} ({r['cap_allowed']}) | "
            f"{_paces(r['paces'], True)} | {_paces(r['paces'], False)} | "
            f"{r['seconds']:.0f} | {r['load_1m']:.1f} | {'yes' if r.get('ok') else 'NO'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--commit", default="", help="only this commit's runs (a sha prefix)")
    ap.add_argument("--file", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows = [r for r in read_results(args.file) if r.get("commit", "").startswith(args.commit)]
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
