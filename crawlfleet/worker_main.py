"""One stage worker's life, shared by ``crawlfleet worker`` and the crawl's lean start.

``python -m crawlfleet.worker_main STAGE --worker-id ID`` runs the same worker as
``crawlfleet worker STAGE --worker-id ID`` with its settings from the environment
(``CRAWLFLEET_*``, as a crawl's fleet passes them) and the config file it names, but
imports nothing of the CLI (typer builds every command's options at start-up, rich, the
crawl's store and frontier modules): a worker started this way reaches its group about a
second sooner on two busy cores, and every crawl starts five of them at once.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from core.config import Settings, load_settings
from core.errors import ConfigError, CrawlfleetError, InfraError


def run_worker(stage: str, s: Settings, worker_id: str | None) -> None:
    """Run one ``stage`` worker until SIGTERM (then leave the group cleanly).

    A broker that does not answer yet, or a store held by someone else, is waited for (with
    back-off, saying so in the log and the worker's status), never a reason to exit.
    """
    from schemas.stages import every_stage
    from streams.worker import StopFlag, worker_name
    known = every_stage()  # after the settings: stage_modules add
    if stage not in known:
        raise ConfigError(f"unknown stage {stage!r}: " + ", ".join(known))
    stop = StopFlag().install()
    name = worker_name(stage, worker_id, s.data_dir / "workers")
    reached = _reach_cluster(s, stop, stage, name)
    if reached is None:
        return  # stopped while waiting for Kafka
    runner = _stage(stage, reached, name, stop)
    if reached.metrics_port >= 0:
        runner.status.metrics.serve(reached, runner.status)
        runner.status.write(force=True)  # the port, for whoever looks for it
    _tune_gc()
    runner.run()


def _reach_cluster(s: Settings, stop: Any, stage: str, name: str) -> Settings | None:
    """``s`` on its cluster, its topics' partition count adopted, once a broker answers and
    its topics exist; None if the worker was stopped while waiting. The wait shows in the
    worker's status file (and its metrics, when served) under the worker's own name."""
    from infra.topics import adopt_partitions, topology_of
    from streams.status import StatusFile
    from streams.worker import wait_for_kafka, wait_for_topics
    waiting = StatusFile(s.status_dir, stage, name)
    if s.metrics_port >= 0:
        waiting.metrics.serve(s, waiting)
    try:
        while True:
            found = wait_for_kafka(s, stop, waiting, f"{stage} {name}")
            if found is None:
                waiting.remove()
                return None
            try:
                # Its input topics first (their wait also shows the broker still answers):
                # its consumer subscribes to them, and an automatic partition count is read
                # from them. Not every topic: a changelog missing is its restore's failure
                # to report (its partitions stay paused), not a reason to stay out.
                names = topology_of(found).inputs(stage)
                if not wait_for_topics(found, names, stop, waiting, f"{stage} {name}"):
                    waiting.remove()
                    return None
                return adopt_partitions(found)
            except InfraError as exc:  # the broker went away again in between
                logging.getLogger("crawlfleet.worker").warning("%s %s: %s", stage, name, exc)
                stop.wait(1.0)
    finally:
        waiting.metrics.close()  # the stage serves its own from here


def _tune_gc() -> None:
    """Long-running workers allocate a few dicts per record: move what start-up created out
    of the collector's sight and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _stage(stage: str, s: Settings, worker_id: str | None, stop: Any) -> Any:
    """The worker of ``stage``: the class its topology declaration names (``entry``)."""
    import importlib

    from schemas.stages import stage_spec
    module, _, cls = stage_spec(stage).entry.partition(":")
    return getattr(importlib.import_module(module), cls)(s, worker_id, stop)


def await_fetch_join(status_dir: Path, limit_s: float) -> None:
    """Return once a fetch worker's status says it has joined its group, or after
    ``limit_s`` (a late stage's deferred start: see ``StageSpec.start_late``)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for path in status_dir.glob("fetch-*.json"):
            try:
                if json.loads(path.read_text()).get("rebalances", 0) > 0:
                    return
            except (OSError, ValueError, AttributeError):
                continue  # being written, or not a status
        time.sleep(0.05)


USAGE = "usage: python -m crawlfleet.worker_main STAGE [--worker-id ID] [--defer-s SECONDS]"


def _option(args: list[str], name: str) -> tuple[str | None, bool]:
    """(value of ``name``, ok), removing it from ``args``; not ok if it has no value."""
    if name not in args:
        return None, True
    at = args.index(name)
    if at + 1 >= len(args):
        return None, False
    value = args[at + 1]
    del args[at:at + 2]
    return value, True


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when stopped, 2 on bad arguments or a fatal error (said on stderr)."""
    args = list(sys.argv[1:] if argv is None else argv)
    worker_id, ok_id = _option(args, "--worker-id")
    defer, ok_defer = _option(args, "--defer-s")
    try:
        defer_s = float(defer) if defer is not None else 0.0
    except ValueError:
        ok_defer = False
    if not (ok_id and ok_defer) or len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = load_settings()
        if defer_s > 0:
            await_fetch_join(settings.status_dir, defer_s)
        run_worker(args[0], settings, worker_id)
    except CrawlfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
