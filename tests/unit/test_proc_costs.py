"""The benchmarks' per-process costs: roles from command lines, CPU and PSS read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.proc_costs import PARTS, ChildCpu, ProcCosts, part_of, pss_bytes, pss_parts, role_of

BURN = ("import time; t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print(time.process_time())")


def test_roles_from_command_lines() -> None:
    py = "/usr/bin/python3"
    assert role_of([py, "-m", "crawlfleet.cli", "worker", "fetch", "--worker-id", "f1"]) == "fetch"
    assert role_of([py, "-m", "crawlfleet.cli", "worker", "quarantine"]) == "quarantine"
    assert role_of([py, "-m", "crawlfleet.worker_main", "parse", "--worker-id", "p"]) == "parse"
    assert role_of(["java", "-Xmx512m", "kafka.Kafka", "server.properties"]) == "broker"
    assert role_of(["/venv/bin/crawlfleet", "crawl", "seeds.txt"]) == "crawl"
    assert role_of(["/usr/bin/scrapy", "runspider"], "scrapy") == "scrapy"
    assert role_of([], "") == "?"


def test_child_cpu_counts_what_a_reaped_child_burned() -> None:
    clock = ChildCpu()
    out = subprocess.run([sys.executable, "-c", BURN], capture_output=True, text=True,
                         check=True)
    burned = float(out.stdout)
    assert clock.stop() >= burned >= 0.3


def test_proc_costs_samples_a_live_process_by_role() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BURN + "\nimport time; time.sleep(5)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        burned = float(proc.stdout.readline())
        costs = ProcCosts()
        costs.sample([proc.pid], with_pss=True)
        costs.watch_outside([os.getpid()])  # counted from now: nothing used yet
    finally:
        proc.kill()
        proc.wait()
    child, me = costs.procs[proc.pid], costs.procs[os.getpid()]
    assert child.cpu >= burned * 0.9 and child.base_cpu == 0  # all of it: started here
    assert child.peak_pss > 2**20  # a Python interpreter's own pages
    assert me.base_cpu == me.cpu > 0  # an outside process counts from its first sample
    roles = costs.by_role()
    assert sum(r.processes for r in roles.values()) == 2
    assert abs(sum(r.cpu_s for r in roles.values()) - child.cpu) < 1e-9


def test_crawl_timeline_splits_the_time_outside_crawling() -> None:
    from bench.shapes_report import crawlfleet_timeline
    line = crawlfleet_timeline({
        "phases": {"first_fetch": 2.5, "last_store": 20.0, "drained": 20.25, "ended": 21.0},
        "hop_ms": {"p50": 12.0, "p90": 30.0, "p99": 61.0, "n": 2996.0}})
    # 2.5 s to the first fetch + 0.25 s drain + 0.75 s teardown
    assert "outside crawling 3.50 s" in line
    assert "first fetch 2.50, drain 0.25, teardown 0.75" in line
    assert "12/30/61 ms over 2996 links" in line
    assert crawlfleet_timeline({}) == "(no timeline in its summary)"


def test_mapping_paths_count_as_their_part() -> None:
    so = "/venv/lib/python3.11/site-packages/chdb/_chdb.abi3.so"
    assert part_of(so) == "chdb"
    assert part_of("/venv/lib/python3.11/site-packages/confluent_kafka.libs/librdkafka.so.1") \
        == "code"
    assert part_of("/usr/bin/python3.11") == "code"
    assert part_of("/usr/lib/jvm/java-17/bin/java") == "code"
    for anon in ("", "[heap]", "[stack]", "[anon:glibc]", "/memfd:jit (deleted)"):
        assert part_of(anon) == "anon", anon
    assert part_of("/data/rocksdb/000012.sst") == "files"
    assert part_of("/usr/lib/locale/locale-archive") == "files"


def test_a_live_process_pss_splits_into_parts_that_add_up() -> None:
    grow = "x = bytearray(64 << 20)\nx[::4096] = b'y' * len(x[::4096])\n"  # 64 MB touched
    proc = subprocess.Popen([sys.executable, "-c", grow + "print('ok', flush=True)\n"
                             "import time; time.sleep(5)"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ok"
        parts = pss_parts(proc.pid)
        total = pss_bytes(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert set(parts) == set(PARTS)
    assert parts["anon"] >= 64 << 20  # the bytearray it touched
    assert parts["code"] > 0 and parts["chdb"] == 0  # an interpreter, no chDB loaded
    assert abs(sum(parts.values()) - total) <= 0.05 * total


def test_a_roles_make_up_is_read_at_its_peak() -> None:
    costs = ProcCosts()
    costs.sample([os.getpid()], with_pss=True)
    me = costs.procs[os.getpid()]
    assert me.parts_at == me.peak_pss > 0
    assert costs.by_role()[me.role].pss_parts_mb["code"] > 0
