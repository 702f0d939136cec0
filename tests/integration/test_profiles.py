"""Profiles and job types on the real broker and store: a job naming a profile nobody
configured is dead-lettered ``unknown_profile`` before any request and the crawl drains; an
unpinned URL requeued under another starting profile is fetched and stored once (its key
leaves the profile out), while one URL pinned to two profiles is two fetches and two rows;
a job record written with the v2 schema is read as pinned."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from core.config import Settings
from core.urls import canonicalize
from infra.topics import topology_of
from producers.frontier import publish
from schemas.codec import default_codec
from schemas.keys import job_key
from schemas.topics import partition_for
from sites.scripted_site import ScriptedSite, page
from streams.io import producer_conf
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    page_counts,
    query,
    wait_drained,
    wait_until,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.2"
UA = "crawlfleet-test/1.0 (+http://127.0.0.1/about)"


def _with_profiles(settings: Settings) -> Settings:
    """Two honest profiles on the direct egress; ``alpha`` is where unpinned jobs start."""
    return settings.replace(default_profile="alpha", profiles={
        "alpha": {"user_agent": UA, "region": "local"},
        "beta": {"user_agent": UA, "region": "local", "bundle_version": "2"}})


def _publish(s: Settings, *lines: dict[str, object] | str) -> dict[str, int]:
    report = publish([ln if isinstance(ln, str) else json.dumps(ln) for ln in lines], s)
    assert not report.errors, report.errors
    assert report.published == len(lines)
    return report.unknown_profiles


def _pages(s: Settings, url: str) -> list[tuple[str, str]]:
    rows = query(s, f"SELECT dedupe_key, profile FROM pages FINAL WHERE url = '{url}' "
                    "ORDER BY dedupe_key")
    return [(str(k), str(p)) for k, p in rows]


def _keys(s: Settings, url: str) -> list[str]:
    """The stored rows' keys of ``url`` (an unpinned page's profile is wherever the fetch
    stage placed it: not asserted here)."""
    return [k for k, _ in _pages(s, url)]


def _dead(s: Settings, reason: str) -> list[list[object]]:
    return query(s, "SELECT url, profile, attempts FROM dead_letters FINAL "
                    f"WHERE reason = '{reason}'")


def test_unknown_profile_dead_letters_and_keys_differ_by_job_type(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    s = _with_profiles(settings)
    create_all_topics(s)
    ws = fleet(s)
    with ScriptedSite(HOST, site_port) as site:
        for p in ("/loose.html", "/pinned.html", "/ghost.html"):
            site.set(p, page(title=p))
        loose, pinned, ghost = (canonicalize(site.url(p))
                                for p in ("/loose.html", "/pinned.html", "/ghost.html"))
        ws.start_pipeline()
        unknown = _publish(s, loose,  # names no profile: unpinned, starting at alpha
                           {"url": pinned, "profile": "alpha"},
                           {"url": pinned, "profile": "beta"},
                           {"url": ghost, "profile": "ghost"})
        assert unknown == {"ghost": 1}  # published all the same, counted for a warning
        wait_until(lambda: _dead(s, "unknown_profile"), 60,
                   f"the ghost job's dead letter\n{ws.logs()}")
        wait_drained(s, ws, 90, lambda: page_counts(s).final >= 3)

        # (a) dead-lettered with its reason before any request; the crawl drained
        assert _dead(s, "unknown_profile") == [[ghost, "ghost", 0]]
        assert site.count("/ghost.html") == 0
        assert _pages(s, ghost) == []
        assert ws.all["fetch-0"].alive()

        # (b) an unpinned job requeued with another starting profile (as after a
        # quarantine) meets its profile-free key: not fetched, not stored again
        assert _keys(s, loose) == [f"*|{loose}"]
        _publish(s, {"url": loose, "profile": "beta", "pinned": False})
        wait_until(lambda: query(s, "SELECT count() FROM lineage FINAL WHERE url = "
                                    f"'{loose}' AND state = 'duplicate'")[0][0] == 1, 60,
                   "the requeued job to be suppressed")
        wait_drained(s, ws, 60)
        assert site.count("/loose.html") == 1
        assert _keys(s, loose) == [f"*|{loose}"]

        # (c) one URL pinned to two profiles: two identities, two legitimate fetches, two rows
        assert site.count("/pinned.html") == 2
        assert _pages(s, pinned) == [(f"alpha|{pinned}", "alpha"), (f"beta|{pinned}", "beta")]


def test_v2_job_records_are_read_as_pinned_and_links_keep_the_job_type(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers]) -> None:
    s = _with_profiles(settings).replace(max_depth=1)
    create_all_topics(s)
    ws = fleet(s)
    with ScriptedSite(HOST, site_port) as site:
        site.set("/old.html", page("/old-child.html", title="old"))
        site.set("/old-child.html", page(title="old child"))
        site.set("/new.html", page("/new-child.html", title="new"))
        site.set("/new-child.html", page(title="new child"))
        old, new = canonicalize(site.url("/old.html")), canonicalize(site.url("/new.html"))
        ws.start_pipeline()

        # (d) a job as a worker before schema v3 wrote it: no pinned field in its schema
        codec = default_codec()
        v2 = next(v for v in codec.versions("CrawlJob") if v.version == 2)
        target = f"{HOST}:{site_port}"
        job = {"url": old, "target": target, "profile": "beta", "depth": 0, "attempt": 0,
               "parent_url": None, "last_error": None, "priority": 0, "meta": {},
               "delay_ms": 0}
        payload, headers = codec.encode("CrawlJob", job, version=v2)
        assert codec.decode("CrawlJob", payload, headers)["pinned"] is True
        producer = Producer(producer_conf(s, "test-v2-writer"))
        topo = topology_of(s)
        producer.produce(topo.frontier, value=payload, key=job_key(target, "beta", old),
                         partition=partition_for(target, topo.partitions), headers=headers)
        assert producer.flush(30) == 0
        _publish(s, new)  # today's unpinned seed, for contrast
        wait_drained(s, ws, 90, lambda: page_counts(s).final >= 4)

        old_child, new_child = (canonicalize(site.url(p))
                                for p in ("/old-child.html", "/new-child.html"))
        assert _pages(s, old) == [(f"beta|{old}", "beta")], ws.logs()
        assert _pages(s, old_child) == [(f"beta|{old_child}", "beta")]  # a pinned page's link
        assert _keys(s, new) == [f"*|{new}"]
        assert _keys(s, new_child) == [f"*|{new_child}"]  # an unpinned one's
        assert [site.count(p) for p in ("/old.html", "/old-child.html", "/new.html",
                                        "/new-child.html")] == [1, 1, 1, 1]
