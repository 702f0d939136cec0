"""The deployment files' stage parts, written from the stage registry.

Each stage (the analytics ones too: a cluster needs its quarantine app) gets a Kubernetes
file (``infra/deploy/k8s/<stage>.yaml``: headless Service, StatefulSet, PodDisruptionBudget,
KEDA ScaledObject) from one template (``infra/deploy/stage.yaml.tpl``) and a service in
``compose.yaml`` between its two marker comments, sized by the stage's ``DeployHints``. A
stage added to the registry is deployed by running ``python -m infra.deploy_files``; the
unit tests fail while the committed files differ from what this writes (``--check``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.config import load_settings
from schemas.stages import every_stage, stage_spec

DEPLOY = Path(__file__).resolve().parent / "deploy"
TEMPLATE = DEPLOY / "stage.yaml.tpl"
COMPOSE = DEPLOY / "compose.yaml"
BEGIN = "  # stages: written from the stage registry by `python -m infra.deploy_files`\n"
END = "# end of stages\n"


def stage_manifest(stage: str) -> str:
    """The Kubernetes objects of ``stage``."""
    hints = stage_spec(stage).deploy
    return (TEMPLATE.read_text().replace("{stage}", stage).replace("{memory}", hints.memory)
            .replace("{lag}", str(hints.lag_per_replica)))


def compose_text(current: str) -> str:
    """``compose.yaml`` with its stage services written from the registry."""
    head, sep, rest = current.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{COMPOSE} lacks the stage markers {BEGIN.strip()!r} / "
                         f"{END.strip()!r}")
    services = "".join(f"  {st}:\n    <<: *stage\n    command: [\"worker\", \"{st}\"]\n"
                       for st in every_stage())
    return head + BEGIN + services + END + tail


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
             if p not in want and p.name != "config.yaml"]
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
