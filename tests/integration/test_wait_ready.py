"""``crawl.wait_ready``, the one patient start-up wait that ``crawl`` and ``chaos`` share.

The groups are described only once every live stage process has reported (a describe sent
before the coordinator is known can time out, and on a fresh three-node cluster librdkafka
may then abort the process, librdkafka#4605); a resumed prefix's stale status files do not
count as reports.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from core.config import Settings
from crawlfleet.crawl import Fleet, Plan, wait_ready
from infra.topics import topology_of
from streams.status import read_statuses

pytestmark = pytest.mark.integration


def test_ready_means_every_live_worker_reported_and_every_group_is_stable(
        settings: Settings, fleet_factory: Callable[..., Fleet]) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    settings.status_dir.mkdir(parents=True)
    for wid in ("fetch-0", "fetch-1", "parse-0", "store-0", "retry-0"):  # an earlier run's
        stage = wid.split("-")[0]
        (settings.status_dir / f"{stage}-{wid}.json").write_text(json.dumps(
            {"stage": stage, "worker": wid, "pid": gone.pid, "counters": {}, "gauges": {},
             "idle_s": 99.0, "wall": time.time() - 600}))
    plan = Plan(fetch_workers=2)
    fleet = fleet_factory(settings, plan)
    # Stale reports do not make a fleet that has not started yet ready.
    began = time.monotonic()
    assert not wait_ready(settings, fleet, timeout_s=0.3)
    assert time.monotonic() - began < 5.0

    assert wait_ready(settings, fleet, timeout_s=90)
    live = {p.pid for p in fleet.procs.values()}
    assert live <= {st["pid"] for st in read_statuses(settings.status_dir)}
    topo = topology_of(settings)
    want = {topo.group(stage): n for stage, n in plan.counts().items()}
    admin = AdminClient(settings.kafka_common())
    for group, fut in admin.describe_consumer_groups(list(want), request_timeout=30).items():
        desc = fut.result()
        assert desc.state == ConsumerGroupState.STABLE, group
        assert len(desc.members) == want[group], group
