"""A local multi-host website for crawler tests, demos and benchmarks.

This module is its command line, for demos and manual crawls: the sites themselves live in
``sites.site_spec`` and its siblings, the server in ``sites.demo_server``. Run
``python -m sites.demo_site --port 18080`` to serve the small demo site (``sites.demo_pages``)
until Ctrl-C (``--bench`` the generated benchmark site, ``--shape NAME`` one of the shapes of
``bench.shapes_bench``, the skewed one with its rate cap enforced).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from sites.bench_site import bench_spec
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite
from sites.shapes import SHAPES, SkewedSite, shape_spec
from sites.site_spec import SiteSpec

__all__ = ["main", "serve_forever"]


def serve_forever(spec: SiteSpec, rate_cap: float | None = None) -> None:
    """Serve ``spec`` until SIGINT or SIGTERM: for demos and manual crawls."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with DemoSite(spec, rate_limit_log=True, rate_cap=rate_cap):
            lines = [
                f"demo site listening on {len(spec.hosts)} hosts, port {spec.port}; seeds:",
                *(f"  {s}" for s in spec.seeds()),
                f"{len(spec.expected())} URLs expected from a full crawl; Ctrl-C to stop",
            ]
            print("\n".join(lines), flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--bench", action="store_true", help="serve the generated bench site")
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=8, help="host count for --bench")
    parser.add_argument("--shape", choices=SHAPES, help="serve a benchmark shape instead")
    parser.add_argument("--scale", type=float, default=1.0, help="page-count scale for --shape")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.shape:
        spec = shape_spec(args.shape, args.port, args.scale)
        serve_forever(spec, rate_cap=spec.cap if isinstance(spec, SkewedSite) else None)
        return
    spec = bench_spec(args.port, args.pages, args.hosts) if args.bench else demo_spec(args.port)
    serve_forever(spec)


if __name__ == "__main__":
    main()
