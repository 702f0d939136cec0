"""Cross-version resume: a crawl cut short on one checkout, kept, and finished by another.

    python -m bench.resume_check --old-tree /path/to/old/checkout [--pages 800] [--cut 12]

The old checkout crawls a generated local site (``sites.bench_site.bench_spec``) with
``--keep-topics`` under a fixed ``--topic-prefix`` and is stopped by its own ``--timeout``
part-way; this checkout then runs ``crawlfleet crawl`` on the same prefix and data dir with
the same seeds (republished: the dedupe state on ``crawl.seen`` drops what was done). The
site's own request log and the store referee the result: every reachable page stored once,
and how many pages were requested more than once (a stop by timeout hands over its finished
work; what was in flight is fetched again). Both runs use the broker ``crawlfleet kafka up``
runs. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.config import load_settings
from infra.store_query import run_query
from sites.bench_site import bench_spec
from sites.demo_server import DemoSite, free_port


def _crawl(tree: Path | None, args: list[str]) -> tuple[int, float]:
    env = dict(os.environ)
    if tree is not None:  # that checkout's packages first (the workers inherit it)
        env["PYTHONPATH"] = str(tree)
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from crawlfleet.cli import app; app()",
                           "crawl", *args], env=env, capture_output=True, text=True,
                          timeout=900)
    sys.stderr.write(proc.stdout[-1500:] + proc.stderr[-1500:])
    return proc.returncode, time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--old-tree", type=Path, required=True)
    parser.add_argument("--pages", type=int, default=800)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate-cap", type=float, default=5.0)
    parser.add_argument("--cut", type=float, default=12.0, help="the old run's --timeout")
    args = parser.parse_args(argv)
    hosts = [f"127.0.0.{2 + k}" for k in range(args.hosts)]
    spec = bench_spec(free_port(hosts, 18700), args.pages, args.hosts)
    expected = set(spec.expected())
    prefix = f"resume{int(time.time())}."
    with tempfile.TemporaryDirectory(prefix="resume-check-") as tmp, DemoSite(spec) as site:
        seeds = Path(tmp) / "seeds.txt"
        seeds.write_text("\n".join(spec.seeds()) + "\n")
        common = [str(seeds), "--allow-private", "--rate-cap", str(args.rate_cap),
                  "--scope", "seeds", "--topic-prefix", prefix, "--data-dir",
                  str(Path(tmp) / "data"), "--keep-topics"]
        old_rc, old_s = _crawl(args.old_tree, [*common, "--timeout", str(args.cut)])
        served_old = {u for u in site.requests if u in expected}
        new_rc, new_s = _crawl(None, [*common, "--summary-json", str(Path(tmp) / "s.json")])
        summary = json.loads((Path(tmp) / "s.json").read_text())
        requested = {u: n for u, n in site.requests.items() if u in expected}
        settings = load_settings(data_dir=Path(tmp) / "data", topic_prefix=prefix)
        _, rows = run_query(settings, "SELECT url, count() FROM pages_v GROUP BY url")
    stored = {r[0]: r[1] for r in rows}
    result = {
        "expected": len(expected), "old_exit": old_rc, "old_s": round(old_s, 1),
        "pages_by_old_run": len(served_old), "new_exit": new_rc, "new_s": round(new_s, 1),
        "stored_distinct": len(set(stored) & expected),
        "stored_twice_in_view": sum(1 for n in stored.values() if n > 1),
        "missing": len(expected - set(stored)),
        "requested_more_than_once": sum(1 for n in requested.values() if n > 1),
        "new_run_summary_pages": summary.get("pages"),
    }
    print(json.dumps(result))
    ok = new_rc == 0 and not result["missing"] and not result["stored_twice_in_view"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
