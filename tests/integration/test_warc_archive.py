"""WARC output on the real broker and store (issue 45.5): a crawl with revisits archived
while the store worker dies the worst way -- its batch's pages appended and fsynced, their
offsets not committed (fault point ``after_warc``, ``os._exit(137)`` as kill -9) -- and is
started again. Every file is read back with warcio's ArchiveIterator and held against
``page_visits`` and ``pages``: one capture per visit (a response, or a revisit record for a
304 or an identical body), none twice, none missing, each revisit pointing at a response
the archive holds.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

from consumers.warc.refs import IDENTICAL_PAYLOAD, PROFILE_URIS, SERVER_NOT_MODIFIED, record_id
from core.config import Settings
from core.urls import canonicalize
from sites.changing_site import ChangingSite
from tests.integration.fleet_helpers import (
    Workers,
    create_all_topics,
    publish_seeds,
    query,
    stage_lags,
    wait_until,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.9"
MODES = {"/e0": "etag", "/m0": "last_modified", "/n0": "none", "/n1": "none",
         "/c0": "clock"}
VISITS = 3


def _archive(d: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(d.glob("*.warc.gz*")):  # finished and open files, not hints
        with path.open("rb") as f:
            for r in ArchiveIterator(f, check_digests="raise"):
                h = r.rec_headers
                out.append({"file": path.name, "type": r.rec_type,
                            "id": h.get_header("WARC-Record-ID"),
                            "uri": h.get_header("WARC-Target-URI"),
                            "profile": h.get_header("WARC-Profile"),
                            "refers_to": h.get_header("WARC-Refers-To"),
                            "concurrent_to": h.get_header("WARC-Concurrent-To"),
                            "http": r.http_headers,
                            "body": r.content_stream().read()})
    return out


def _visit_rows(s: Settings) -> list[tuple[str, int, str, str]]:
    """Every visit stored (the replayed batch's rows collapse: FINAL)."""
    return [(str(k), int(v), str(u), str(o)) for k, v, u, o in query(
        s, "SELECT dedupe_key, visit, url, outcome FROM page_visits FINAL")]


def _enough(rows: list[tuple[str, int, str, str]]) -> bool:
    per_page = collections.Counter(u for _, _, u, _ in rows)
    return len(per_page) == len(MODES) and min(per_page.values()) >= VISITS \
        and any(o == "changed" for *_, o in rows)


def test_every_visit_is_archived_once_across_a_store_kill(
        settings: Settings, site_port: int, fleet: Callable[[Settings], Workers],
        tmp_path: Path) -> None:
    warc = tmp_path / "warc"
    s = settings.replace(revisit="every 2s", warc_dir=str(warc), warc_max_bytes=4096)
    create_all_topics(s)
    ws = fleet(s)
    with ChangingSite(HOST, site_port) as site:
        urls = {p: canonicalize(site.add(p, mode)) for p, mode in MODES.items()}
        ws.start_pipeline(store_0={"CRAWLFLEET_FAULT": "after_warc:3"})
        revisit = ws.start("revisit")
        publish_seeds(s, urls.values())
        store = ws.all["store-0"]
        assert store.wait_exit(60) == 137, store.log_tail()
        assert "dying at after_warc #3" in store.log()
        site.change("/n0")  # its next visit is a change: a response again
        store = ws.restart("store-0")
        ws.wait_store_ready()
        wait_until(lambda: _enough(_visit_rows(s)), 60,
                   f"{VISITS} visits of every page, /n0's change among them")
        revisit.stop()  # no more visits fall due; those on their way are stored
        wait_until(lambda: not any(n for stage, n in stage_lags(s).items()
                                   if stage != "revisit"), 60, "the visits in flight stored")
        rows = _visit_rows(s)
        pages = {str(u) for (u,) in query(s, "SELECT url FROM pages FINAL")}
        store.stop()
    log = store.log()
    records = _archive(warc)

    # the restarted store cut what its predecessor wrote past the last commit, and wrote it
    # again: no file is left open, every record is there once
    ids = collections.Counter(r["id"] for r in records)
    assert [i for i, n in ids.items() if n > 1] == []
    assert "written again from offset" in log, log[-3000:]
    assert not [r["file"] for r in records if r["file"].endswith(".open")]
    assert not list(warc.glob("*.idx"))  # finished files keep no hint
    assert len({r["file"] for r in records}) >= 3  # rotated by size (4 KiB)

    # one capture per visit stored, of the kind the visit's outcome says
    assert len(rows) == len(set(rows)) >= VISITS * len(MODES)
    captures = {r["id"]: r for r in records if r["type"] in ("response", "revisit")}
    expected = {}
    for key, visit, url, outcome in rows:
        mode = MODES[next(p for p, u in urls.items() if u == url)]
        if outcome == "not_modified":
            kind, profile = "revisit", PROFILE_URIS[SERVER_NOT_MODIFIED]
        elif outcome == "unchanged" and mode == "none":  # the very same bytes again
            kind, profile = "revisit", PROFILE_URIS[IDENTICAL_PAYLOAD]
        else:  # new, changed, or unchanged text in new bytes (a timestamp): archived whole
            kind, profile = "response", None
        expected[record_id(key, visit, kind)] = (url, kind, profile)
    assert {i: (c["uri"], c["type"], c["profile"]) for i, c in captures.items()} == expected
    outcomes = collections.Counter(o for _, _, _, o in rows)
    assert outcomes["not_modified"] and outcomes["unchanged"] and outcomes["changed"], outcomes

    # each capture has its request; each revisit points at a response of its URI in the
    # archive; every page of ``pages`` has its response
    requests = [r for r in records if r["type"] == "request"]
    assert sorted(r["concurrent_to"] for r in requests) == sorted(captures)
    sent = {h.get_header("User-Agent") for h in (r["http"] for r in requests)}
    assert sent == {s.user_agent}  # the headers as sent, the session's own among them
    conditional = [r["http"].get_header("If-None-Match") for r in requests]
    assert any(conditional)  # a revisit's request shows what it asked
    responses = {i: c for i, c in captures.items() if c["type"] == "response"}
    for c in captures.values():
        if c["type"] == "revisit":
            assert responses[c["refers_to"]]["uri"] == c["uri"], c
    assert {c["uri"] for c in responses.values()} == pages == set(urls.values())
    n0 = [c["body"] for c in responses.values() if c["uri"] == urls["/n0"]]
    assert any(b"alpha" in b for b in n0) and any(b"bravo" in b for b in n0)
