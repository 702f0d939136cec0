"""Lineage on the real broker: crawl a small site with a redirect, a duplicate link, a page
retried once and a dead page, and trace each URL from SQL."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from core.config import Settings
from core.urls import canonicalize
from crawlfleet.crawl import settings_env
from crawlfleet.trace import Event, trace
from sites.scripted_site import ScriptedSite, page, redirect, status
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    publish_seeds,
    query,
    wait_drained,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.3"


def _names(events: list[Event], url: str) -> list[str]:
    return [e.event for e in events if e.url == url]


def _before(names: list[str], *order: str) -> bool:
    """``order`` occurs in ``names`` in this order (not necessarily adjacent)."""
    it = iter(names)
    return all(any(n == want for n in it) for want in order)


def test_trace_follows_each_job_through_the_pipeline(settings: Settings, site_port: int,
                                                     fleet: Callable[[Settings], Workers]
                                                     ) -> None:
    s = settings.replace(max_attempts=2, rate_cap=20.0)
    create_all_topics(s)
    ws = fleet(s)
    with ScriptedSite(HOST, site_port) as site:
        u = {name: canonicalize(site.url(f"/{name}.html"))
             for name in ("index", "a", "old", "new", "flaky", "gone")}
        site.set("/index.html", page(u["a"], u["old"], u["flaky"], u["gone"]))
        site.set("/a.html", page(u["index"]))  # a link back to a page already crawled
        site.set("/old.html", redirect(u["new"]))
        site.set("/new.html", page())
        site.set("/flaky.html", status(503), page())  # once 503, then fine
        site.set("/gone.html", status(503))  # always 503: dead after max_attempts
        ws.start_pipeline()
        publish_seeds(s, [u["index"], u["a"]])  # a.html is also linked from index: a repeat
        wait_drained(s, ws, 120, lambda: page_counts(s).final >= 6 and int(
            query(s, "SELECT count() FROM dead_letters FINAL")[0][0]) >= 1)

        index = trace(s, u["index"])
        names = _names(index, u["index"])
        assert names[0] == "enqueued" and names.count("fetched") == 1
        assert _before(names, "enqueued", "fetched", "parsed", "stored")
        # a.html links back to it: enqueued by parse, then suppressed by its dedupe key.
        assert _before(names, "fetched", "enqueued", "duplicate")
        dup = next(e for e in index if e.event == "duplicate")
        assert dup.detail == "fetch: done" and dup.worker == "fetch-0"
        fetched = next(e for e in index if e.event == "fetched")
        assert fetched.status == 200 and fetched.worker == "fetch-0"
        assert fetched.version.startswith("crawlfleet-fetch/")
        parsed = next(e for e in index if e.event == "parsed")
        assert parsed.worker == "parse-0" and parsed.detail.startswith("4 links")

        a = _names(trace(s, u["a"]), u["a"])  # a seed and a link: one fetch, one duplicate
        assert sorted(a) == sorted(["enqueued", "enqueued", "fetched", "duplicate", "parsed",
                                    "stored"])
        assert a[0] == "enqueued" and _before(a, "fetched", "parsed", "stored")

        old = trace(s, u["old"])  # the redirect, and the hop to its target
        assert _before(_names(old, u["old"]), "enqueued", "fetched")
        hop = next(e for e in old if e.event == "fetched" and e.url == u["old"])
        assert hop.status == 301 and hop.detail == "redirect"
        assert _before(_names(old, u["new"]), "enqueued", "fetched", "parsed", "stored")
        target_in = next(e for e in old if e.url == u["new"] and e.event == "enqueued")
        assert target_in.detail == f"fetch: redirect from {u['old']}"
        assert old.index(hop) < old.index(target_in)

        flaky = _names(trace(s, u["flaky"]), u["flaky"])
        assert _before(flaky, "enqueued", "retried", "released", "fetched", "parsed", "stored")
        assert flaky.count("fetched") == 1

        gone = trace(s, u["gone"])
        # The last attempt's fetch event and its dead letter are one step, stamped by two
        # records within the same millisecond or so: either may sort first.
        names = _names(gone, u["gone"])
        assert _before(names, "enqueued", "retried", "released") and \
            {"failed", "dead"} <= set(names[names.index("released"):])
        dead = next(e for e in gone if e.event == "dead")
        assert dead.detail.startswith("http_503") and "dlq show" in dead.detail

        # The command prints the same, as a table.
        env = {**os.environ, **settings_env(s)}
        env.pop("CRAWLFLEET_CONFIG", None)
        out = subprocess.run([sys.executable, "-m", "crawlfleet.cli", "trace", u["gone"],
                              "--format", "tsv"],
                             env=env, capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stderr
        lines = [ln.split("\t") for ln in out.stdout.splitlines()]
        assert lines[0][:3] == ["time", "url", "event"]
        assert [ln[2] for ln in lines[1:]] == _names(gone, u["gone"])
