"""The deployment files' stage parts, written from the stage registry and one sizes table.

Each stage (the analytics ones too: a cluster needs its quarantine app) gets a Kubernetes
file (``infra/deploy/k8s/<stage>.yaml``: headless Service, StatefulSet, PodDisruptionBudget,
KEDA ScaledObject) from one template (``infra/deploy/stage.yaml.tpl``), and services in
``compose.yaml`` between marker comments: one per worker (``<stage>-<n>``), each with a
fixed worker id and a named state volume of its own, so a recreated container is the same
worker on the same state. Sizes (replicas, CPU, memory, disk, lag per replica) are read from
``infra/deploy/sizes.json`` -- one place, taken from ``crawlfleet plan`` at the scale it
names -- and, for a stage of your own, from its ``DeployHints``. A stage added to the
registry is deployed by running ``python -m infra.deploy_files``; the unit tests fail while
the committed files differ from what this writes (``--check``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from core.config import load_settings
from schemas.stages import every_stage, stage_spec

DEPLOY = Path(__file__).resolve().parent / "deploy"
TEMPLATE = DEPLOY / "stage.yaml.tpl"
COMPOSE = DEPLOY / "compose.yaml"
SIZES = DEPLOY / "sizes.json"
#: k8s files written by hand (shared settings, the one-shot topics and schema jobs), not per
#: stage.
HAND_WRITTEN = ("config.yaml", "topics.yaml", "schema.yaml")
BEGIN = "  # stages: written from the stage registry by `python -m infra.deploy_files`\n"
END = "# end of stages\n"
VOLUMES_BEGIN = "  # worker state volumes: written by `python -m infra.deploy_files`\n"
VOLUMES_END = "# end of worker state volumes\n"
#: Where every worker's data dir (CRAWLFLEET_DATA_DIR) is, in the image and in the pods.
DATA_DIR = "/var/lib/crawlfleet"


@dataclass(frozen=True)
class StageSize:
    replicas: int
    cpu: str
    memory: str
    disk: str
    lag_per_replica: int
    compose_replicas: int


@cache
def sizes_table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SIZES.read_text())
    return data


def stage_size(stage: str) -> StageSize:
    """``stage``'s row of the sizes table, else its declared ``DeployHints``."""
    row = sizes_table()["stages"].get(stage)
    if row is not None:
        return StageSize(**row)
    hints = stage_spec(stage).deploy
    return StageSize(1, hints.cpu, hints.memory, hints.disk, hints.lag_per_replica, 1)


def stage_manifest(stage: str) -> str:
    """The Kubernetes objects of ``stage``."""
    size, table = stage_size(stage), sizes_table()
    known = stage in table["stages"]
    scale_note = ("the plan's workers at its stated scale (infra/deploy/sizes.json)" if known
                  else "one: a stage of your own (its DeployHints)")
    lag_note = ("2 x what a busy worker holds read but uncommitted (sizes.json)" if known
                else "its DeployHints' lag per replica")
    values = {"stage": stage, "replicas": str(size.replicas), "cpu": size.cpu,
              "memory": size.memory, "disk": size.disk, "lag": str(size.lag_per_replica),
              "partitions": str(table["partitions"]), "scale_note": scale_note,
              "lag_note": lag_note}
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def compose_workers() -> list[tuple[str, str]]:
    """(service = worker id, stage) of every compose worker: ``<stage>-<n>``."""
    return [(f"{st}-{n}", st) for st in every_stage()
            for n in range(stage_size(st).compose_replicas)]


def _between(text: str, begin: str, end: str, body: str) -> str:
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"{COMPOSE} lacks the markers {begin.strip()!r} / {end.strip()!r}")
    return head + begin + body + end + tail


def compose_text(current: str) -> str:
    """``compose.yaml`` with its worker services and their volumes written from the
    registry: a fixed id (``--worker-id``, also the hostname) and a state volume each."""
    services = "".join(
        f"  {wid}:\n    <<: *stage\n    hostname: {wid}\n"
        f"    command: [\"worker\", \"{st}\", \"--worker-id\", \"{wid}\"]\n"
        f"    volumes: [\"{wid}-state:{DATA_DIR}\"]\n" for wid, st in compose_workers())
    volumes = "".join(f"  {wid}-state:\n" for wid, _ in compose_workers())
    return _between(_between(current, BEGIN, END, services), VOLUMES_BEGIN, VOLUMES_END,
                    volumes)


def expected() -> dict[Path, str]:
    """Every file this writes, with the content it must have."""
    out = {DEPLOY / "k8s" / f"{st}.yaml": stage_manifest(st) for st in every_stage()}
    out[COMPOSE] = compose_text(COMPOSE.read_text())
    return out


def stale() -> list[Path]:
    """Files that differ from what the registry writes, and stage files of no stage."""
    want = expected()
    wrong = [p for p, text in want.items() if not p.exists() or p.read_text() != text]
    stray = [p for p in (DEPLOY / "k8s").glob("*.yaml")
             if p not in want and p.name not in HAND_WRITTEN]
    return sorted(wrong + stray)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a file differs from what would be written")
    ap.add_argument("--config", type=Path, help="a crawlfleet config file whose stage_modules "
                    "declare stages of your own (CRAWLFLEET_STAGE_MODULES works too)")
    args = ap.parse_args(argv)
    load_settings(args.config)  # imports the stage_modules: their stages are deployed too
    if args.check:
        off = stale()
        for p in off:
            print(f"stale: {p}", file=sys.stderr)
        return 1 if off else 0
    for path, text in expected().items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
