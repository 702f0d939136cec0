"""SCALING.md's figures and the deployment sizes, generated from the measured costs.

    python -m crawlfleet.sizing --write    # infra/deploy/sizes.json, SCALING.md, manifests
    python -m crawlfleet.sizing --check    # exit 1 if any of them drifted from costs.json

Why: a figure copied by hand from ``crawlfleet plan`` into a manifest or a document goes stale
the day the costs are measured again (issue 42: a PVC of 10Gi against a plan of ~38 GB). Here
one function runs the plan at the stated scale (:data:`SCALE`) on ``infra/costs.json`` and
everything is written from its result: ``infra/deploy/sizes.json`` (replicas, CPU, disk,
partitions), the generated sections of ``infra/SCALING.md`` (between ``<!-- sizing:NAME -->``
markers), the partition count of ``infra/deploy/k8s/config.yaml``, and through
``infra.deploy_files`` the compose file and Kubernetes manifests that read sizes.json. A
unit test runs ``--check``. What the plan has no figure for (memory, lag per replica,
compose's workers) is :data:`HAND_COLUMNS`, kept from the committed table.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from core.config import Settings
from crawlfleet.plan import Costs, NodeLimits, Plan, margin_text, plan
from infra import deploy_files
from schemas.stages import every_stage, stage_spec, stages

SCALING = deploy_files.DEPLOY.parent / "SCALING.md"
#: The shared settings' ConfigMap (otherwise written by hand): its partition count is the plan's.
CONFIG = deploy_files.DEPLOY / "k8s" / "config.yaml"
_PARTITIONS = re.compile(r'^  CRAWLFLEET_PARTITIONS: .*$', re.M)
SCHEMA_JOB = deploy_files.DEPLOY / "k8s" / "schema.yaml"
_STORE_WORKERS = re.compile(r'"--store-workers", "\d+"')
#: The stated scale: pages a day, targets, requests/s per target.
SCALE = (1e9, 10_000_000, 2.0)
BIG_PAGES = 60_000.0  # the second column of SCALING.md's plan
#: RocksDB's headroom over its live data (compaction writes new files before deleting old).
DISK_SLACK = 1.3
#: The columns the plan has no figure for: memory (fetch's from the hostile test's ~5.6 KB
#: per target at max_target_state 10,000 plus max_buffered jobs), lag per replica (2 x what a
#: busy worker holds read but uncommitted) and compose's workers (one host). They are kept
#: from the committed table (edit them there); a stage not in it takes its DeployHints.
HAND_COLUMNS = ("memory", "lag_per_replica", "compose_replicas")
UNPLANNED_CPU = "500m"  # a stage the plan does not size (the quarantine app)


def _plan(costs: Costs, page_bytes: float | None = None) -> tuple[Plan, NodeLimits]:
    limits = NodeLimits(page_bytes=page_bytes)
    pages, targets, cap = SCALE
    return plan(pages, targets, cap, costs, limits, seen_ttl_s=Settings().seen_ttl_s), limits


def _sci(x: float) -> str:
    """1e9 as a command line would say it."""
    mantissa, _, exp = f"{x:.0e}".partition("e")
    return f"{mantissa}e{int(exp)}"


def _gi(gb: float) -> str:
    return f"{max(1, math.ceil(gb * DISK_SLACK * 1e9 / 2**30))}Gi"


def _hand(stage: str) -> dict[str, Any]:
    row = json.loads(deploy_files.SIZES.read_text())["stages"].get(stage)
    if row is not None:
        return {k: row[k] for k in HAND_COLUMNS}
    hints = stage_spec(stage).deploy
    return {"memory": hints.memory, "lag_per_replica": hints.lag_per_replica,
            "compose_replicas": 1}


def state_gb(p: Plan) -> dict[str, float]:
    """The plan's figure for each state store that holds one (by the store's name)."""
    return {"seen": p.seen_gb, "parked": p.parked_gb, "timers": p.timers_gb}


def sizes(costs: Costs) -> dict[str, Any]:
    """The sizes table (``infra/deploy/sizes.json``) at :data:`SCALE`."""
    p, limits = _plan(costs)
    held = state_gb(p)
    cpu = f"{round(limits.worker_cpu * 1000)}m"
    rows: dict[str, dict[str, Any]] = {}
    for st in every_stage():
        n = p.workers.get(st, 1)
        local = sum(held.get(d.name, 0.0) for d in stage_spec(st).state) / n
        rows[st] = {"replicas": n, "cpu": cpu if st in stages() else UNPLANNED_CPU,
                    "disk": _gi(local) if local else "1Gi", **_hand(st)}
        rows[st] = {k: rows[st][k] for k in ("replicas", "cpu", "memory", "disk",
                                             "lag_per_replica", "compose_replicas")}
    fetch_gb = (p.seen_gb + p.parked_gb) / p.workers["fetch"]
    m = costs.measured
    pages, targets, cap = SCALE
    return {
        "scale": f"crawlfleet plan --pages-per-day {_sci(pages)} --targets {targets} (cap {cap:g} "
                 f"req/s, the measured {costs.page_bytes:,.0f} B pages, infra/costs.json of "
                 f"{m.get('commit', '?')}; infra/SCALING.md)",
        "generated": "by python -m crawlfleet.sizing --write from infra/costs.json: do not "
                     "edit by hand",
        "partitions": p.partitions,
        "how": {
            "replicas": "the plan's workers of the stage (KEDA moves them between 1 and the "
                        "partition count)",
            "cpu": f"the plan's worker_cpu: each worker is planned at {limits.worker_cpu:g} "
                   "of a core; a stage the plan does not size (quarantine) keeps "
                   f"{UNPLANNED_CPU}",
            "memory": "not in the plan (it has no memory figure): fetch from the hostile "
                      "test's ~5.6 KB per target at max_target_state 10,000 plus max_buffered "
                      "jobs; memory, lag_per_replica and compose_replicas are kept as this "
                      "table has them (edit them here), every other figure is written",
            "disk": f"fetch: (dedupe {p.seen_gb:,.1f} GB + parked {p.parked_gb:,.1f} GB) / "
                    f"{p.workers['fetch']} workers = {fetch_gb:,.1f} GB, x{DISK_SLACK:g} for "
                    f"RocksDB compaction; retry: timers {p.timers_gb:,.2f} GB; the others keep "
                    "only status files",
            "lag_per_replica": "2 x the work a busy worker holds read but uncommitted (its "
                               "lag at pace): fetch max_buffered 5,000, parse batch 2,000, "
                               "store store_batch_rows 5,000, retry / revisit batch 500; "
                               "parked jobs and timers are committed off the input, so they "
                               "are not lag",
            "compose_replicas": "workers per stage in compose.yaml (one host; the embedded "
                                "store only with one store worker)",
        },
        "stages": rows,
    }


def sizes_text(costs: Costs) -> str:
    """sizes.json as written: one line per stage, so a diff shows which stage moved."""
    table = sizes(costs)
    rows = table.pop("stages")
    head = json.dumps(table, indent=2)[:-2]  # without the closing "\n}"
    lines = ",\n".join(f"    {json.dumps(st)}: {json.dumps(row)}" for st, row in rows.items())
    return f'{head},\n  "stages": {{\n{lines}\n  }}\n}}\n'


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms"


def costs_section(costs: Costs, data: dict[str, Any]) -> str:
    """The measured costs, shape by shape, and the figure the plan takes."""
    m, shapes = costs.measured, data.get("shapes", {})
    names = list(shapes)
    head = "| cost per page | " + " | ".join(names) + " | the plan (highest) |\n"
    head += "|---" * (len(names) + 2) + "|\n"

    def row(what: str, get: Any, fmt: Any, plan_value: float) -> str:
        cells = [fmt(get(shapes[n])) for n in names]
        return f"| {what} | " + " | ".join(cells) + f" | {fmt(plan_value)} |\n"

    out = head
    for role in sorted(costs.cpu_s, key=lambda r: (r == "broker", r)):
        out += row(f"CPU, {role}", lambda r, k=role: r["cpu_s_per_page"].get(k, 0.0), _ms,
                   costs.cpu_s[role])
    for topic in ("fetched", "parsed", "frontier", "seen", "lineage", "telemetry", "dead"):
        out += row(f"`crawl.{topic}` bytes", lambda r, k=topic: r["topic_bytes_per_page"]
                   .get(k, 0.0), lambda v: f"{v:,.1f} B", costs.topic_bytes.get(topic, 0.0))
    out += row("broker wire in (produced, 1 replica)", lambda r: r["wire_bytes_per_page"]["in"],
               lambda v: f"{v:,.0f} B", costs.wire_in or 0.0)
    out += row("broker wire out (consumed by the stages)",
               lambda r: r["wire_bytes_per_page"]["out"], lambda v: f"{v:,.0f} B",
               costs.wire_out or 0.0)
    out += row("ClickHouse, compressed (all tables)", lambda r: r["store_bytes_per_page"],
               lambda v: f"{v:,.0f} B", costs.store_bytes_per_page)
    out += row("seen store on disk, per key", lambda r: r["seen_bytes_per_key"],
               lambda v: f"{v:,.1f} B", costs.seen_bytes_per_key)
    out += row("page body", lambda r: r["page_bytes"], lambda v: f"{v:,.0f} B",
               costs.page_bytes)
    for n in names:
        runs = shapes[n].get("runs", [])
        if len(runs) > 1:
            each = "; ".join(
                f"load {r['load_average']:.1f}, {r['crawl_seconds']:.0f} s: " + ", ".join(
                    f"{k} {v * 1e3:.2f}" for k, v in sorted(r["cpu_s_per_page"].items()))
                for r in runs)
            out += (f"\n{n}, CPU ms per page run by run (the table has the highest; a longer "
                    f"crawl on a crowded machine costs more per page): {each}.\n")
    held = data.get("held", {})
    hm = held.get("measured", {})
    out += (f"\nHeld work ({hm.get('shape', '?')}, capped at {hm.get('cap', '?')} req/s, "
            f"{hm.get('pages', '?')} pages): {held.get('parked_per_page', 0.0):.3f} parked "
            f"jobs per page of {costs.parked_bytes_per_record:,.0f} B each (record), "
            f"{costs.parked_disk_bytes_per_key or 0.0:,.0f} B per live key in the store on "
            f"disk ({hm.get('parked_live_at_peak', '?')} keys at the peak); "
            f"{held.get('timers_per_page', 0.0):.3f} timers per page of "
            f"{costs.timer_bytes_per_record:,.0f} B each (the timers' store held "
            f"{hm.get('timers_live_at_peak', '?')} keys at most: its on-disk size is "
            "RocksDB's fixed files, so the plan sizes timers by their records).\n")
    rounds = max((len(shapes[n].get("runs", [])) for n in names), default=1) or 1
    out += (f"\nMeasured on {m.get('commit', '?')} at {m.get('at', '?')}, "
            f"{m.get('pages', '?')} pages over the shapes in each of {rounds} rounds; "
            f"{m.get('figures', '')}. "
            f"{m.get('machine', '')}.\n")
    return out


def plan_section(costs: Costs) -> str:
    """The plan at :data:`SCALE` for the measured pages and for 60 KB pages."""
    small, limits = _plan(costs)
    big, _ = _plan(costs, BIG_PAGES)
    cols = (small, big)

    def row(what: str, fmt: Any) -> str:
        return f"| {what} | " + " | ".join(fmt(p) for p in cols) + " |\n"

    st = list(small.workers)
    targets = SCALE[1]
    out = (f"| | {costs.page_bytes / 1e3:,.0f} KB pages (measured) | {BIG_PAGES / 1e3:,.0f} "
           "KB pages |\n|---|---|---|\n")
    out += row("pages/s", lambda p: f"{p.pages_per_s:,.0f}")
    out += row("partitions per topic", lambda p: f"{p.partitions:,}")
    out += row("workers: " + " / ".join(st), lambda p: " / ".join(
        f"{p.workers[s]:,}" for s in st))
    out += row(f"broker disk writes ({limits.replication} replicas)",
               lambda p: f"{p.broker_mb_s:,.1f} MB/s")
    out += row("broker network in / out (all brokers)",
               lambda p: f"{p.network_mb_s[0]:,.1f} / {p.network_mb_s[1]:,.1f} MB/s")
    out += row("brokers", lambda p: f"{p.brokers:,}")
    out += row("dedupe state (7-day `seen_ttl_s`), fetch workers' disks / changelog",
               lambda p: f"{p.seen_gb:,.1f} GB / {p.changelog_gb:,.1f} GB")
    out += row("parked backlog (a day's pages published at once), local / changelog",
               lambda p: f"{p.parked_gb:,.1f} GB / {p.parked_changelog_gb:,.1f} GB")
    out += row("retry timers, local / changelog",
               lambda p: f"{p.timers_gb:,.2f} GB / {p.timers_changelog_gb:,.2f} GB")
    out += row("ClickHouse, compressed, per replica",
               lambda p: f"{p.store_gb_per_day:,.1f} GB/day, {p.store_nodes} shard(s) x "
                         f"{p.store_replicas} replicas")
    out += row("targets per fetch worker", lambda p: f"{targets / p.workers['fetch']:,.0f}")
    out += row("binds first", lambda p: f"{p.binds_first}: {p.saturates_first} "
                                        f"{p.loads[p.saturates_first]:.0%}")
    out += row("margin of the others", margin_text)
    out += (f"\nLimits assumed per machine (`NodeLimits`): {limits.worker_cpu:g} core per "
            f"worker, brokers at {limits.broker_mb_s:g} MB/s of disk writes, "
            f"{limits.broker_cpu:g} cores and a {limits.network_mb_s:g} MB/s NIC each, "
            f"{limits.worker_disk_gb:g} GB of state disk per fetch worker, ClickHouse at "
            f"{limits.store_mb_s:g} MB/s ingest per node, {limits.store_replicas} replicas. "
            "A margin is how much more traffic that resource takes, at this fleet's size, "
            "before it binds too.\n")
    return out


def scaling_text(costs: Costs, data: dict[str, Any], current: str) -> str:
    """``current`` SCALING.md with its generated sections rewritten."""
    text = current
    for name, body in (("costs", costs_section(costs, data)), ("plan", plan_section(costs))):
        begin, end = f"<!-- sizing:{name} -->\n", f"<!-- end sizing:{name} -->\n"
        head, sep, rest = text.partition(begin)
        _, sep2, tail = rest.partition(end)
        if not sep or not sep2:
            raise ValueError(f"{SCALING} lacks the markers {begin.strip()} / {end.strip()}")
        text = head + begin + body + end + tail
    return text


def config_text(costs: Costs, current: str) -> str:
    """The ConfigMap with the plan's partition count (the topics job creates them so)."""
    line = (f'  CRAWLFLEET_PARTITIONS: "{sizes(costs)["partitions"]}"  # the plan\'s '
            "(python -m crawlfleet.sizing)")
    if not _PARTITIONS.search(current):
        raise ValueError(f"{CONFIG} sets no CRAWLFLEET_PARTITIONS")
    return _PARTITIONS.sub(line, current, count=1)


def schema_job_text(costs: Costs, current: str) -> str:
    """The schema Job with the store's replicas (its deduplication window is sized for
    them)."""
    if not _STORE_WORKERS.search(current):
        raise ValueError(f"{SCHEMA_JOB} passes no --store-workers")
    n = sizes(costs)["stages"]["store"]["replicas"]
    return _STORE_WORKERS.sub(f'"--store-workers", "{n}"', current, count=1)


def expected() -> dict[Path, str]:
    """sizes.json, SCALING.md, the ConfigMap and the schema Job as the costs write them."""
    costs = Costs.load(costs_path())
    data = json.loads(costs_path().read_text())
    return {deploy_files.SIZES: sizes_text(costs),
            SCALING: scaling_text(costs, data, SCALING.read_text()),
            CONFIG: config_text(costs, CONFIG.read_text()),
            SCHEMA_JOB: schema_job_text(costs, SCHEMA_JOB.read_text())}


def costs_path() -> Path:
    return deploy_files.DEPLOY.parent / "costs.json"


def stale() -> list[Path]:
    """Files that differ from what the costs write: sizes.json, SCALING.md, manifests."""
    wrong = [p for p, text in expected().items() if p.read_text() != text]
    return sorted(wrong + deploy_files.stale())


def write() -> list[Path]:
    for path, text in expected().items():
        path.write_text(text)
    deploy_files.sizes_table.cache_clear()  # the manifests read the sizes just written
    out = list(expected())
    for path, text in deploy_files.expected().items():
        path.write_text(text)
        out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write every generated file")
    mode.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 if a file differs from what would be written")
    args = ap.parse_args(argv)
    if args.check:
        off = stale()
        for p in off:
            print(f"stale: {p} (python -m crawlfleet.sizing --write)", file=sys.stderr)
        return 1 if off else 0
    for p in write():
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
