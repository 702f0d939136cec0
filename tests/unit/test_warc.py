"""WARC output (issue 45.5), without a broker: the records a page becomes, the captures
carried from visit to visit, and the file protocol that keeps every page exactly once
across a kill (append, cut where the input goes back, write again byte for byte)."""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

from consumers.fetch.exchange import REDACTED, redacted, status_line
from consumers.warc.files import cut, parse_name, partition_files
from consumers.warc.records import page_records
from consumers.warc.refs import (
    IDENTICAL_PAYLOAD,
    PROFILE_URIS,
    RESPONSE,
    SERVER_NOT_MODIFIED,
    capture_kind,
    carried,
    last_capture,
    payload_digest,
    record_id,
)
from consumers.warc.sink import WarcSink
from core.config import Settings
from core.errors import ConfigError

TS_MS = 1_700_000_000_000
TOPIC = "crawl.parsed"


def page(i: int, *, status: int = 200, body: bytes = b"<html><p>hello</p></html>",
         visit: int = 0, last: dict[str, str] | None = None) -> dict[str, Any]:
    url = f"http://site.test/p{i}"
    return {"dedupe_key": f"default|{url}", "url": url, "status": status, "visit": visit,
            "fetched_at_ms": TS_MS + 1000 * i, "body_bytes": len(body),
            "content_type": "text/html",
            "status_line": f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Modified'}",
            "response_headers": [["Content-Type", "text/html"], ["Content-Encoding", "gzip"],
                                 ["Content-Length", "17"], ["Set-Cookie", REDACTED]],
            "request_method": "GET", "request_url": url,
            "request_headers": [["Host", "site.test"], ["User-Agent", "crawlfleet/0.1"],
                                ["Cookie", REDACTED]],
            "body_z": zlib.compress(body) if body else b"",
            "payload_digest": payload_digest(body) if body else "",
            "last_capture": last or {}}


def records(data: bytes) -> list[Any]:
    out = []
    for r in ArchiveIterator(io.BytesIO(data)):
        out.append((r.rec_type, dict(r.rec_headers.headers),
                    r.http_headers, r.content_stream().read()))
    return out


def read_dir(d: Path) -> list[tuple[str, str, str]]:
    """(type, record id, source) of every record of every file, in file order."""
    out = []
    for path in sorted(d.iterdir()):
        with path.open("rb") as f:
            for r in ArchiveIterator(f):
                out.append((r.rec_type, r.rec_headers.get_header("WARC-Record-ID"),
                            r.rec_headers.get_header("Crawlfleet-Source") or ""))
    return out


def test_a_page_is_a_response_and_its_request_with_the_body_decoded() -> None:
    p = page(1)
    (rtype, rh, http, body), (qtype, qh, qhttp, _) = records(page_records(p, f"{TOPIC}:0:7"))
    assert (rtype, qtype) == ("response", "request")
    assert body == b"<html><p>hello</p></html>"
    assert rh["WARC-Target-URI"] == qh["WARC-Target-URI"] == p["url"]
    assert rh["WARC-Date"] == "2023-11-14T22:13:21Z"
    assert rh["WARC-Record-ID"] == record_id(p["dedupe_key"], 0, "response")
    assert qh["WARC-Concurrent-To"] == rh["WARC-Record-ID"]
    assert rh["WARC-Payload-Digest"] == p["payload_digest"]
    assert rh["Crawlfleet-Source"] == f"{TOPIC}:0:7"
    # the body is decoded: its wire headers are kept aside, its length is the real one
    assert http.get_header("Content-Encoding") is None
    assert http.get_header("X-Crawlfleet-Orig-Content-Encoding") == "gzip"
    assert http.get_header("Content-Length") == str(len(body))
    assert http.get_header("Set-Cookie") == REDACTED
    assert qhttp.protocol == "GET" and qhttp.statusline == "/p1 HTTP/1.1"
    assert qhttp.get_header("Cookie") == REDACTED


def test_records_are_the_same_bytes_every_time() -> None:
    """No clock, no random id: a page written again after a kill is what it was."""
    assert page_records(page(3), "t:0:3") == page_records(page(3), "t:0:3")


def test_a_304_is_a_server_not_modified_revisit_of_the_last_response() -> None:
    first = page(1)
    ref = last_capture(carried(first["dedupe_key"], 0, 200, first["url"], first["fetched_at_ms"],
                               first["payload_digest"], {}))
    assert ref["id"] == record_id(first["dedupe_key"], 0, "response")
    again = {**page(1, status=304, body=b"", visit=1, last=ref), "response_headers": []}
    [(rtype, rh, _http, body), _request] = records(page_records(again, "t:0:9"))
    assert rtype == "revisit" and body == b""
    assert rh["WARC-Profile"] == PROFILE_URIS[SERVER_NOT_MODIFIED]
    assert rh["WARC-Refers-To"] == ref["id"]
    assert rh["WARC-Refers-To-Target-URI"] == first["url"]
    assert rh["WARC-Refers-To-Date"] == "2023-11-14T22:13:21Z"


def test_identical_bytes_are_a_revisit_and_changed_bytes_a_response() -> None:
    """A 200 with the last response's very bytes is an identical-payload revisit; a page
    whose text is unchanged but whose bytes are not (a timestamp) is archived whole."""
    body = b"<html>same</html>"
    digest = payload_digest(body)
    last = {"id": "<urn:uuid:x>", "uri": "u", "date": "d", "digest": digest}
    assert capture_kind(200, 1, digest, last) == IDENTICAL_PAYLOAD
    assert capture_kind(200, 1, payload_digest(b"<html>same</html> "), last) == RESPONSE
    assert capture_kind(200, 0, digest, last) == RESPONSE
    assert capture_kind(304, 2, "", {}) == SERVER_NOT_MODIFIED
    [(rtype, rh, _h, _b), _] = records(page_records(page(2, body=body, visit=1, last=last),
                                                    "t:0:1"))
    assert (rtype, rh["WARC-Profile"], rh["WARC-Payload-Digest"]) == (
        "revisit", PROFILE_URIS[IDENTICAL_PAYLOAD], digest)
    # a revisit hands its reference on: the next visit refers to the same response
    assert carried("k", 1, 200, "u2", TS_MS, digest, last) == {
        f"warc_{k}": v for k, v in last.items()}


def test_a_page_whose_body_did_not_travel_says_it_is_truncated() -> None:
    p = {**page(4), "body_z": b"", "payload_digest": ""}
    [(rtype, rh, _h, body), _] = records(page_records(p, "t:0:4"))
    assert rtype == "response" and body == b"" and rh["WARC-Truncated"] == "unspecified"


def _run(d: Path, offsets: range, max_bytes: int = 2500, worker: str = "store-1") -> WarcSink:
    sink = WarcSink(d, max_bytes, worker)
    sink.write([(TOPIC, 0, i, page(i)) for i in offsets])  # type: ignore[misc]
    return sink


def test_a_replay_after_a_kill_writes_the_same_files_once(tmp_path: Path) -> None:
    """Pages 0-11 written with no kill, against: 0-9 written, the worker killed (nothing
    closed), its successor given 6-11 again (offsets committed up to 6): the same files,
    byte for byte, every page once."""
    calm, killed = tmp_path / "calm", tmp_path / "killed"
    _run(calm, range(12)).close()
    _run(killed, range(10))  # killed: its open file is left as it was
    assert any(p.name.endswith(".open") for p in killed.iterdir())
    successor = _run(killed, range(6, 12))
    successor.close()
    assert successor.records_cut == 8  # pages 6-9 (a response and a request each)
    assert {p.name: p.read_bytes() for p in calm.iterdir()} == \
        {p.name: p.read_bytes() for p in killed.iterdir()}
    sources = [src for rtype, _, src in read_dir(killed) if rtype == "response"]
    assert sources == [f"{TOPIC}:0:{i}" for i in range(12)]
    assert len(list(calm.iterdir())) >= 3  # rotated by size


def test_a_cut_removes_a_torn_record_and_names_what_it_kept(tmp_path: Path) -> None:
    _run(tmp_path, range(3), max_bytes=1 << 20)  # killed mid-append: a torn last member
    [(path, name)] = partition_files(tmp_path, TOPIC, 0)
    assert name.last is None
    with path.open("ab") as f:
        f.write(page_records(page(3), f"{TOPIC}:0:3")[:40])
    assert cut(tmp_path, TOPIC, 0, 3) == 0
    [(path, name)] = partition_files(tmp_path, TOPIC, 0)
    assert (name.first, name.last) == (0, 2)
    assert [s for t, _, s in read_dir(tmp_path) if t == "response"] == [
        f"{TOPIC}:0:{i}" for i in range(3)]


def test_the_new_owner_cuts_the_killed_owners_files(tmp_path: Path) -> None:
    """A shared directory: store-1 wrote 0-9 and was killed with 5 committed; store-2,
    given the partition, starts at 5 and cuts store-1's files there."""
    _run(tmp_path, range(10), worker="store-1")
    _run(tmp_path, range(5, 10), worker="store-2").close()
    responses = [s for t, _, s in read_dir(tmp_path) if t == "response"]
    assert sorted(responses, key=lambda s: int(s.rsplit(":", 1)[1])) == [
        f"{TOPIC}:0:{i}" for i in range(10)]
    owners = {n.worker for _, n in partition_files(tmp_path, TOPIC, 0)}
    assert owners == {"store-1", "store-2"}
    assert not any(p.name.endswith(".open") for p in tmp_path.iterdir())


def test_file_names_round_trip() -> None:
    n = parse_name("p.crawl.parsed+3+000000000010-000000000020+host-store-1.warc.gz")
    assert n is not None and (n.topic, n.partition, n.first, n.last, n.worker) == (
        "p.crawl.parsed", 3, 10, 20, "host-store-1")
    assert parse_name(n.file_name) == n
    assert parse_name("x+1+2-3+w.warc.gz.open") is None  # an open file has no last
    assert parse_name("notes.txt") is None


def test_request_secrets_are_redacted() -> None:
    sent = [("Host", "a"), ("Authorization", "Bearer s3cret"), ("Cookie", "sid=1"),
            ("Proxy-Authorization", "Basic eA=="), (b"X-Raw", b"caf\xc3\xa9")]
    assert redacted(sent) == [["Host", "a"], ["Authorization", REDACTED],
                              ["Cookie", REDACTED], ["Proxy-Authorization", REDACTED],
                              ["X-Raw", "café"]]
    assert status_line(None, 404, "Not Found") == "HTTP/1.1 404 Not Found"


def test_warc_settings_are_checked(tmp_path: Path) -> None:
    Settings(warc_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="max_response_bytes"):
        Settings(warc_dir=str(tmp_path), max_response_bytes=8 << 20)
    with pytest.raises(ConfigError, match="warc_max_bytes"):
        Settings(warc_max_bytes=10)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="directory"):
        Settings(warc_dir=str(tmp_path / "f"))


class _Gate:
    def add(self, n: int) -> None:
        pass


def _parsed(warc_dir: str, job_validators: dict[str, str], body: bytes, visit: int = 0
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The page and the next visit's job the parse stage makes of one fetch result."""
    from consumers.parse import ParseStage, RecentSet
    from core.config import load_settings
    from core.revisits import RevisitPolicies
    from infra.topics import topology_of
    from schemas.records import CrawlJob, ParsedPage
    from streams.io import Encoder
    s = load_settings(topic_prefix="u.", partitions=4, warc_dir=warc_dir)
    stage = object.__new__(ParseStage)  # its parsing alone: no consumer, no gate thread
    stage.settings, stage.topology = s, topology_of(s)
    stage.encoder, stage.worker = Encoder(stage.topology, "p1"), "p1"
    stage._recent, stage._allowed, stage._gate = RecentSet(), frozenset(), _Gate()  # type: ignore[assignment]
    stage._revisits = RevisitPolicies("every 1h", {})
    stage.status = type("S", (), {"add": lambda *a: None})()  # type: ignore[assignment]
    url = "http://a.test/page"
    job = {"url": url, "target": "a.test", "profile": "default", "depth": 0, "attempt": 0,
           "parent_url": None, "last_error": None, "priority": 0, "meta": {}, "delay_ms": 0,
           "pinned": True, "kind": "page", "visit": visit, "validators": job_validators}
    exchange = {k: v for k, v in page(0).items() if k in (
        "status_line", "response_headers", "request_method", "request_url", "request_headers")}
    result = {"job": job, "final_url": url, "status": 200, "content_type": "text/html",
              "body": body, "fetched_at_ms": TS_MS, "elapsed_ms": 5, "redirects": [],
              "worker": "f1", "profile_bundle_version": "", "http_version": "",
              "tls_version": "", "code_revision": "", "outcome": "ok", "reason": "",
              "attempt_ms": 5, "fetcher_version": "", "validators": {}, **exchange}
    outs = stage._outputs(result)  # type: ignore[arg-type]
    codec = stage.encoder.codec
    parsed = codec.decode_as(ParsedPage, outs[0].value, outs[0].headers)
    jobs = [codec.decode_as(CrawlJob, o.value, o.headers) for o in outs[1:]]
    return dict(parsed), [dict(j) for j in jobs]


def test_parse_carries_the_body_and_the_capture_only_when_archiving(tmp_path: Path) -> None:
    body = b"<html><p>words</p></html>"
    off, [nxt_off] = _parsed("", {}, body)
    assert not off["body_z"] and not off["payload_digest"] and not off["request_headers"]
    assert not any(k.startswith("warc_") for k in nxt_off["validators"])
    on, [nxt] = _parsed(str(tmp_path), {}, body)
    assert zlib.decompress(on["body_z"]) == body
    assert on["payload_digest"] == payload_digest(body)
    assert on["request_headers"] == page(0)["request_headers"]
    ref = last_capture(nxt["validators"])
    assert ref == {"id": record_id(on["dedupe_key"], 0, RESPONSE), "uri": on["url"],
                   "date": "2023-11-14T22:13:20Z", "digest": payload_digest(body)}
    # the next visit, the same bytes: a revisit of that response, which it hands on
    again, [third] = _parsed(str(tmp_path), nxt["validators"], body, visit=1)
    assert again["last_capture"] == ref
    assert last_capture(third["validators"]) == ref
    [(rtype, rh, _h, _b), _] = records(page_records(again, "t:0:5"))  # type: ignore[arg-type]
    assert (rtype, rh["WARC-Refers-To"]) == ("revisit", ref["id"])


@pytest.mark.parametrize("hint", ["kept", "missing", "stale"])
def test_a_cut_reads_from_the_hint_or_from_the_start_alike(tmp_path: Path, hint: str) -> None:
    """The hint beside an open file lets a cut inflate only its tail; without it, or with
    one that names the wrong bytes, the cut reads the whole file: the same files either way."""
    sink = WarcSink(tmp_path, 1 << 20, "store-1")
    for start in (0, 4, 8):  # three batches: the hint grows with each sync
        sink.write([(TOPIC, 0, i, page(i)) for i in range(start, start + 4)])  # type: ignore[misc]
    [hint_file] = tmp_path.glob("*.warc.idx")
    if hint == "missing":
        hint_file.unlink()
    elif hint == "stale":
        hint_file.write_text("".join(f"{i} {i * 3 + 1}\n" for i in range(12)))
    assert cut(tmp_path, TOPIC, 0, 7) == 10  # pages 7-11, a response and a request each
    [(path, name)] = partition_files(tmp_path, TOPIC, 0)
    assert (name.first, name.last) == (0, 6) and not list(tmp_path.glob("*.idx"))
    assert [s for t, _, s in read_dir(tmp_path) if t == "response"] == [
        f"{TOPIC}:0:{i}" for i in range(7)]
    calm = tmp_path / "calm"
    _run(calm, range(7), max_bytes=1 << 20).close()
    assert path.read_bytes() == next(calm.glob("*.warc.gz")).read_bytes()
