"""The approved set on the real broker, with two fetch workers of two code revisions.

An empty set enforces nothing (both fetch); approving one tuple makes the other worker
leave its group at once and refuse (its status says why and how to approve it) while the
approved one crawls the site to the end; approving the other lets it back in with no
restart; revoking the first makes that one leave within seconds and the partitions move
on to the other, which crawls the rest. Every stored page carries its fetcher's tuple.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from importlib.metadata import version

import pytest
from fleet_helpers import (
    Workers,
    create_all_topics,
    lead_assignment,
    publish_seeds,
    query,
    wait_until,
)

from core.config import Settings
from core.urls import target_of
from crawlfleet.crawl import settings_env
from infra.views import expand, load_views
from schemas.topics import partition_for
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 10))
N = 6  # pages per host and phase
PARTITIONS = 2  # one per fetch worker


def _tuple(code: str) -> str:
    """The canonical tuple, written out here from the libraries themselves."""
    return f"bundle=1;http=aiohttp/{version('aiohttp')};tls={ssl.OPENSSL_VERSION};code={code}"


A, B, P = _tuple("rev-a"), _tuple("rev-b"), _tuple("rev-pipeline")


def _cli(s: Settings, *args: str) -> str:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")},
           **settings_env(s)}
    out = subprocess.run([sys.executable, "-m", "crawlfleet.cli", *args], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, f"crawlfleet {' '.join(args)}: {out.stderr[-2000:]}"
    return out.stdout


def _port() -> int:
    """A port on which the hosts' targets fall on both partitions (a target's partition
    depends on its port)."""
    start = 18700
    while True:
        port = free_port(HOSTS, start)
        parts = {partition_for(target_of(f"http://{h}:{port}/"), PARTITIONS) for h in HOSTS}
        if len(parts) == PARTITIONS:
            return port
        start = port + 1


def _phase(url: str) -> int:
    """Phase 0, 1 or 2 of a page URL (/p/<phase * 100 + i>.html)."""
    return int(url.rsplit("/", 1)[1].removesuffix(".html")) // 100


def _stored(s: Settings, phase: int) -> int:
    return sum(_phase(str(u)) == phase for (u,) in query(s, "SELECT url FROM pages_v"))


def _holders(s: Settings) -> dict[str, int]:
    return {w: len(tps) for w, tps in lead_assignment(s, "fetch").items() if tps}


def test_two_versions_under_the_approved_set(settings: Settings,
                                             fleet: Callable[[Settings], Workers]) -> None:
    s = settings.replace(partitions=PARTITIONS, code_revision="rev-pipeline")
    port = _port()
    with BehaviourSite(port, {h: Behaviour() for h in HOSTS}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=2, fetch_0={"CRAWLFLEET_CODE_REVISION": "rev-a"},
                          fetch_1={"CRAWLFLEET_CODE_REVISION": "rev-b"})
        fa, fb = ws.all["fetch-0"], ws.all["fetch-1"]

        def crawl(phase: int) -> None:
            publish_seeds(s, [site.url(h, phase * 100 + i) for h in HOSTS for i in range(N)])
            wait_until(lambda: _stored(s, phase) >= len(HOSTS) * N, 90,
                       f"the pages of phase {phase} stored")

        # 1. Empty set: no enforcement, both consume.
        assert "empty: no enforcement" in _cli(s, "approved")
        wait_until(lambda: _holders(s) == {"fetch-0": 1, "fetch-1": 1}, 60,
                   "both fetch workers holding a partition")
        crawl(0)
        wait_until(lambda: fa.counter("fetched") > 0 and fb.counter("fetched") > 0, 10,
                   "both fetch workers to report pages fetched")

        # 2. Approve A and the pipeline's own tuple in one write: B leaves and refuses.
        approved_at = time.monotonic()  # the command's own start-up (~1 s) counts too
        out = _cli(s, "approve", "--current", A)
        assert f"approved {A}" in out and f"approved {P}" in out
        wait_until(lambda: _holders(s) == {"fetch-0": PARTITIONS}, 30,
                   "fetch-1 to leave and fetch-0 to own every partition")
        b_left_s = time.monotonic() - approved_at
        wait_until(lambda: fb.gauge("refused") == 1, 10, "fetch-1 to report the refusal")
        refused = fb.status()["waiting"]
        assert refused.startswith("refused: ") and B in refused
        assert f"crawlfleet approve '{B}'" in refused
        assert f"crawlfleet approve '{B}'" in fb.log()
        fetched_b = fb.counter("fetched")
        listed = _cli(s, "approved")
        assert A in listed and P in listed and B not in listed
        crawl(1)  # the approved worker crawls the site to the end
        assert fb.counter("fetched") == fetched_b and fb.alive() and fb.starts == 1

        # 3. Approve B: fetch-1 starts again by itself (no restart); revoke A: fetch-0
        # leaves within seconds and fetch-1 takes every partition and crawls the rest.
        _cli(s, "approve", B)
        wait_until(lambda: _holders(s) == {"fetch-0": 1, "fetch-1": 1}, 30,
                   "fetch-1 back in the group")
        assert fb.gauge("refused") == 0 and fb.starts == 1
        revoked_at = time.monotonic()
        out = _cli(s, "revoke", A)
        assert f"revoked {A}" in out
        wait_until(lambda: _holders(s) == {"fetch-1": PARTITIONS}, 30,
                   "fetch-0 to leave and fetch-1 to own every partition")
        a_left_s = time.monotonic() - revoked_at
        wait_until(lambda: fa.gauge("refused") == 1, 10, "fetch-0 to report the refusal")
        fetched_a = fa.counter("fetched")
        crawl(2)
        assert fa.counter("fetched") == fetched_a and fa.alive()
        assert "left its group" in fa.log()

        pages = query(s, "SELECT url, fetch_worker, profile_bundle_version, http_version, "
                         "tls_version, code_revision FROM pages_v")
        versions = {name: query(s, expand(v.sql, 3600))
                    for name, v in load_views().items() if name.startswith("version_")}
    print(f"\nall partitions with the other worker {b_left_s:.2f} s after `approve` was run "
          f"(leaving the other tuple out), {a_left_s:.2f} s after `revoke` was run (session "
          f"timeout {s.session_timeout_ms / 1000:g} s)")
    assert b_left_s < 10 and a_left_s < 10  # a static member would hold them 30 s

    by_phase: dict[int, Counter[str]] = {0: Counter(), 1: Counter(), 2: Counter()}
    for url, worker, bundle, http, tls, code in pages:
        # each page carries the tuple of the worker that fetched it
        assert f"bundle={bundle};http={http};tls={tls};code={code}" == \
            {"fetch-0": A, "fetch-1": B}[worker]
        by_phase[_phase(url)][code] += 1
    assert set(by_phase[0]) == {"rev-a", "rev-b"}  # no enforcement: both fetched
    assert by_phase[1] == {"rev-a": len(HOSTS) * N}  # only the approved one
    assert by_phase[2] == {"rev-b": len(HOSTS) * N}  # the partitions moved on
    tuples = {r[0]: r for r in versions["version_success"]}
    assert set(tuples) == {A, B}
    assert sum(r[6] for r in tuples.values()) == 3 * len(HOSTS) * N  # requests
    pages_by_tuple = {r[0]: r[2] for r in versions["version_pages"]}
    assert pages_by_tuple == {A: sum(ph["rev-a"] for ph in by_phase.values()),
                              B: sum(ph["rev-b"] for ph in by_phase.values())}
