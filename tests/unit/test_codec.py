"""The registry-free Avro codec: round trips, schema evolution and decode failures."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from core.errors import DecodeError
from schemas.codec import SCHEMA_DIR, Codec, default_codec
from schemas.topics import HEADER_SCHEMA

TS_MS = 1_700_000_000_123
TS = datetime.fromtimestamp(TS_MS / 1000, UTC)

JOB: dict[str, Any] = {
    "url": "https://example.com/dir/page?a=1&b=2",
    "target": "example.com",
    "profile": "default",
    "depth": 2,
    "attempt": 1,
    "parent_url": "https://example.com/dir/",
    "last_error": "timeout",
    "priority": 1,
    "meta": {"source": "seeds.txt", "campaign": "ünïcode ✓"},
    "delay_ms": 15_000,
    "pinned": False,  # not the default: a round trip shows it is written
    "kind": "page",
    "visit": 2,  # a revisit, with what the last visit answered
    "validators": {"etag": '"v1"', "last_modified": "Mon, 30 Nov 2026 10:00:00 GMT"},
}
#: What a job written before v4 reads as: a first visit of a page, no validators.
V4_DEFAULTS = {"kind": "page", "visit": 0, "validators": {}}

V1_FIELDS = ("url", "target", "profile", "depth", "attempt", "parent_url", "last_error")


#: The version tuple pages carry (FetchResult v2, ParsedPage v3).
VERSIONS = {"profile_bundle_version": "2", "http_version": "aiohttp/3.14.5",
            "tls_version": "OpenSSL 3.0.13 30 Jan 2024", "code_revision": "1a2b3c4d5e6f"}


#: The exchange a WARC record needs (FetchResult v5, ParsedPage v7).
EXCHANGE: dict[str, Any] = {
    "status_line": "HTTP/1.1 200 OK",
    "response_headers": [["Content-Type", "text/html"], ["Set-Cookie", "[redacted]"],
                         ["Set-Cookie", "[redacted]"]],
    "request_method": "GET", "request_url": "https://example.com/dir/page?a=1&b=2",
    "request_headers": [["Host", "example.com"], ["Cookie", "[redacted]"]],
}


def fetch_result() -> dict[str, Any]:
    return {
        "job": JOB,
        "final_url": "https://example.com/dir/page/?a=1&b=2",
        "status": 200,
        "content_type": "text/html; charset=utf-8",
        "body": b"<html><title>t</title>\x00\xff binary-safe</html>",
        "fetched_at_ms": TS_MS,
        "elapsed_ms": 123,
        "redirects": ["https://example.com/dir/page?a=1&b=2"],
        "worker": "fetch-1@host",
        **VERSIONS,
        "outcome": "ok", "reason": "", "attempt_ms": 130, "fetcher_version": "crawlfleet/0.1",
        "validators": {"etag": 'W/"7"', "last_modified": "Mon, 30 Nov 2026 10:00:00 GMT"},
        **EXCHANGE,
    }


def parsed_page() -> dict[str, Any]:
    return {
        "dedupe_key": "default|https://example.com/",
        "url": "https://example.com/",
        "final_url": "https://example.com/",
        "target": "example.com",
        "profile": "default",
        "depth": 0,
        "status": 200,
        "content_type": "text/html",
        "title": "Example Domain",
        "text": "This domain is for use in illustrative examples. Ça va?",
        "links": ["https://example.com/a", "https://www.iana.org/domains/example"],
        "body_bytes": 1256,
        "fetched_at_ms": TS_MS,
        "fetch_worker": "fetch-1",
        "parse_worker": "parse-3",
        "parsed_at_ms": TS_MS,
        **VERSIONS,
        "enqueued": [{"url": "https://example.com/a", "target": "example.com",
                      "dedupe_key": "default|https://example.com/a"}],
        "parse_version": "0.1.0",
        "attempt": 1, "outcome": "blocked", "reason": "http_403", "attempt_ms": 90,
        "fetcher_version": "crawlfleet/0.1",
        # a revisit whose text did not change (not the defaults: the round trip shows them)
        "visit": 3, "changed": False, "signature": "0f" * 16,
        "validators": {"etag": '"e3"', "signature": "0f" * 16}, "pinned": False,
        "priority": 1, "meta": {"campaign": "daily"}, "egress": "px2",
        **EXCHANGE, "body_z": b"x\x9c\x03\x00\x00\x00\x00\x01",
        "payload_digest": "sha1:3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ",
        "last_capture": {"id": "<urn:uuid:0>", "uri": "https://example.com/"},
        "next_visit_ms": 21_600_000,
    }


def dead_letter_with_job() -> dict[str, Any]:
    return {
        "job": JOB,
        "raw": None,
        "source_topic": "crawl.frontier",
        "reason": "server_error",
        "error": "HTTP 503 from https://example.com/ after 3 attempts",
        "attempts": 3,
        "worker": "fetch-2",
        "version": "0.1.0",
        "failed_at_ms": TS_MS,
    }


def dead_letter_raw() -> dict[str, Any]:
    return {
        "job": None,
        "raw": b"\x00\x01garbage",
        "source_topic": "crawl.fetched",
        "reason": "undecodable",
        "error": "FetchResult: missing cf-schema header",
        "attempts": 0,
        "worker": "parse-1",
        "version": "0.1.0",
        "failed_at_ms": TS_MS,
    }


def fetch_event() -> dict[str, Any]:
    return {
        "url": "https://example.com/",
        "target": "example.com",
        "profile": "default",
        "attempt": 0,
        "status": 429,
        "outcome": "retry",
        "reason": "http_429",
        "elapsed_ms": 40,
        "bytes": 0,
        "worker": "fetch-1",
        "fetcher_version": "aiohttp/3.14.5",
        "http_version": "HTTP/1.1",
        "tls_version": "TLSv1.3",
        "profile_bundle_version": "1",
        "code_revision": "0.1.0",
        "ts_ms": TS_MS,
        "event_id": "5f0c2a9e8b7d4c1a9e3f6b2d8c4a7e1f",
        "egress": "eu-proxy-1",
    }


def _with_ts(value: dict[str, Any], *fields: str) -> dict[str, Any]:
    """timestamp-millis fields are read back as aware datetimes."""
    return {**value, **{f: TS for f in fields}}


ROUND_TRIPS = [
    ("CrawlJob", JOB, JOB),
    ("FetchResult", fetch_result(), _with_ts(fetch_result(), "fetched_at_ms")),
    ("ParsedPage", parsed_page(), _with_ts(parsed_page(), "fetched_at_ms", "parsed_at_ms")),
    ("DeadLetter", dead_letter_with_job(), _with_ts(dead_letter_with_job(), "failed_at_ms")),
    ("DeadLetter", dead_letter_raw(), _with_ts(dead_letter_raw(), "failed_at_ms")),
    ("Seen", {"state": "RETRYING", "attempt": 2, "status": 503},
     {"state": "RETRYING", "attempt": 2, "status": 503}),
    ("Seen", {"state": "DONE", "attempt": 0, "status": 200},
     {"state": "DONE", "attempt": 0, "status": 200}),
    ("Control", {"kind": "cap", "target": "example.com", "value": 0.5, "text": None,
                 "issued_by": "ops@cli"},
     {"kind": "cap", "target": "example.com", "value": 0.5, "text": None,
      "issued_by": "ops@cli"}),
    ("Control", {"kind": "pause", "target": None, "value": None, "text": "maintenance",
                 "issued_by": ""},
     {"kind": "pause", "target": None, "value": None, "text": "maintenance", "issued_by": ""}),
    ("FetchEvent", fetch_event(), _with_ts(fetch_event(), "ts_ms")),
]


@pytest.fixture(scope="module")
def codec() -> Codec:
    return default_codec()


@pytest.mark.parametrize(("record", "value", "expected"), ROUND_TRIPS,
                         ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(ROUND_TRIPS)])
def test_round_trip(codec: Codec, record: str, value: dict[str, Any],
                    expected: dict[str, Any]) -> None:
    payload, headers = codec.encode(record, value)
    assert headers == [(HEADER_SCHEMA, codec.latest(record).fingerprint.encode())]
    assert codec.decode(record, payload, headers) == expected


def test_every_record_type_is_known(codec: Codec) -> None:
    for record in ("CrawlJob", "FetchResult", "ParsedPage", "DeadLetter", "Seen", "Control",
                   "FetchEvent"):
        assert codec.latest(record).record == f"crawlfleet.{record}"
        assert codec.latest(f"crawlfleet.{record}") is codec.latest(record)


def test_fingerprints_are_unique_and_hex(codec: Codec) -> None:
    all_versions = [v for r in ("CrawlJob", "FetchResult", "ParsedPage", "DeadLetter", "Seen",
                                "Control", "FetchEvent") for v in codec.versions(r)]
    fps = [v.fingerprint for v in all_versions]
    assert len(set(fps)) == len(fps)
    for fp in fps:
        assert len(fp) == 16
        int(fp, 16)


def test_fingerprints_are_stable_across_instances(codec: Codec) -> None:
    other = Codec()
    for record in ("CrawlJob", "FetchResult", "DeadLetter", "Seen"):
        assert other.latest(record).fingerprint == codec.latest(record).fingerprint


# --- schema evolution ---------------------------------------------------------------------


def test_crawljob_versions_are_ordered(codec: Codec) -> None:
    versions = codec.versions("CrawlJob")
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert versions[-1] is codec.latest("CrawlJob")
    assert len({v.fingerprint for v in versions}) == 4


def test_v1_crawljob_is_read_by_v2_reader_with_defaults(codec: Codec) -> None:
    v1 = codec.versions("CrawlJob")[0]
    old = {k: JOB[k] for k in V1_FIELDS}
    payload, headers = codec.encode("CrawlJob", old, version=v1)
    assert headers == [(HEADER_SCHEMA, v1.fingerprint.encode())]
    decoded = codec.decode("CrawlJob", payload, headers)
    assert decoded == {**old, "priority": 0, "meta": {}, "delay_ms": 0, "pinned": True,
                       **V4_DEFAULTS}


def test_v2_crawljob_is_read_as_pinned(codec: Codec) -> None:
    """Before v3 every job was pinned in effect (its key was profile|URL): so it reads."""
    v2 = codec.versions("CrawlJob")[1]
    old = {k: v for k, v in JOB.items() if k not in ("pinned", *V4_DEFAULTS)}
    payload, headers = codec.encode("CrawlJob", old, version=v2)
    assert headers == [(HEADER_SCHEMA, v2.fingerprint.encode())]
    assert codec.decode("CrawlJob", payload, headers) == {**old, "pinned": True,
                                                           **V4_DEFAULTS}


def test_v1_payload_differs_from_v2_payload(codec: Codec) -> None:
    v1 = codec.versions("CrawlJob")[0]
    old = {k: JOB[k] for k in V1_FIELDS}
    p1, _ = codec.encode("CrawlJob", old, version=v1)
    p2, _ = codec.encode("CrawlJob", {**old, "priority": 0, "meta": {}, "delay_ms": 0})
    assert p1 != p2  # so reading with the writer schema from the header really matters


def test_encoding_a_record_missing_required_fields_fails(codec: Codec) -> None:
    # Writers must supply every field; leaving out a required one is a bug, not a default.
    with pytest.raises((ValueError, TypeError, KeyError)):
        codec.encode("CrawlJob", {"url": "https://example.com/"})


def _schema_dir(tmp_path: Path, name: str, files: list[str]) -> Path:
    d = tmp_path / name
    d.mkdir()
    for f in files:
        shutil.copy(SCHEMA_DIR / f, d / f)
    return d


def test_records_embedding_different_crawljob_versions_have_different_fingerprints(
        tmp_path: Path) -> None:
    """A FetchResult embedding a v1 CrawlJob is a different writer schema than one embedding
    v2; sharing a fingerprint would make a reader decode old bytes with the wrong schema.
    The newer codec still knows the old one, so a result in flight across the upgrade of
    the job schema is read (its job with the new fields' defaults), not dead-lettered."""
    old = Codec(_schema_dir(tmp_path, "old", ["crawl_job.v1.avsc", "fetch_result.v1.avsc"]))
    new = Codec(_schema_dir(tmp_path, "new", ["crawl_job.v1.avsc", "crawl_job.v2.avsc",
                                              "fetch_result.v1.avsc"]))
    assert old.latest("FetchResult").fingerprint != new.latest("FetchResult").fingerprint
    v1_job = {k: JOB[k] for k in V1_FIELDS}
    payload, headers = old.encode("FetchResult", {**fetch_result(), "job": v1_job})
    decoded = new.decode("FetchResult", payload, headers)
    assert decoded["job"] == {**v1_job, "priority": 0, "meta": {}, "delay_ms": 0}
    assert decoded["body"] == fetch_result()["body"]
    # An unknown writer (a record embedding a job schema this codec never saw) still fails.
    newer = Codec(_schema_dir(tmp_path, "newer", ["crawl_job.v2.avsc", "crawl_job.v3.avsc",
                                                  "fetch_result.v1.avsc"]))
    with pytest.raises(DecodeError, match="unknown"):
        newer.decode("FetchResult", payload, headers)


def test_records_in_flight_across_the_v3_job_upgrade_decode(codec: Codec,
                                                            tmp_path: Path) -> None:
    """A dead letter and a fetch result written by a v2-era worker (job without ``pinned``)
    are read by today's codec with the job pinned, as it was in effect."""
    old = Codec(_schema_dir(tmp_path, "v2", ["crawl_job.v1.avsc", "crawl_job.v2.avsc",
                                             "fetch_result.v1.avsc", "dead_letter.v1.avsc"]))
    v2_job = {k: v for k, v in JOB.items() if k not in ("pinned", *V4_DEFAULTS)}
    payload, headers = old.encode("FetchResult", {**fetch_result(), "job": v2_job})
    assert codec.decode("FetchResult", payload, headers)["job"] == {**v2_job, "pinned": True,
                                                                    **V4_DEFAULTS}
    letter = {"job": v2_job, "raw": None, "source_topic": "crawl.frontier", "reason": "x",
              "error": "e", "attempts": 1, "worker": "w", "version": "0",
              "failed_at_ms": TS_MS}
    payload, headers = old.encode("DeadLetter", letter)
    assert codec.decode("DeadLetter", payload, headers)["job"] == {**v2_job, "pinned": True,
                                                                   **V4_DEFAULTS}


def test_a_v4_fetch_result_and_a_v6_page_read_with_no_exchange(codec: Codec) -> None:
    """Records written before the WARC fields (FetchResult v5, ParsedPage v7) read as having
    no exchange, no kept body and no last capture: the store writes no WARC record of theirs
    it cannot fill, and nothing is dead-lettered."""
    exchange = {"status_line": "", "response_headers": [], "request_method": "",
                "request_url": "", "request_headers": []}
    v4 = next(v for v in codec.versions("FetchResult") if v.version == 4)
    old = {k: v for k, v in fetch_result().items() if k not in EXCHANGE}
    payload, headers = codec.encode("FetchResult", old, version=v4)
    assert codec.decode("FetchResult", payload, headers) == {
        **_with_ts(old, "fetched_at_ms"), **exchange}
    v6 = next(v for v in codec.versions("ParsedPage") if v.version == 6)
    page = {k: v for k, v in parsed_page().items()
            if k not in (*EXCHANGE, "body_z", "payload_digest", "last_capture",
                         "next_visit_ms")}
    payload, headers = codec.encode("ParsedPage", page, version=v6)
    decoded = codec.decode("ParsedPage", payload, headers)
    assert not decoded.pop("body_z")  # fastavro reads a bytes default as "": falsy either way
    assert decoded == {**_with_ts(page, "fetched_at_ms", "parsed_at_ms"), **exchange,
                       "payload_digest": "", "last_capture": {}, "next_visit_ms": 0}


# --- decode failures ----------------------------------------------------------------------


def test_missing_header(codec: Codec) -> None:
    payload, _ = codec.encode("CrawlJob", JOB)
    with pytest.raises(DecodeError, match="header"):
        codec.decode("CrawlJob", payload, None)
    with pytest.raises(DecodeError, match="header"):
        codec.decode("CrawlJob", payload, [])
    with pytest.raises(DecodeError, match="header"):
        codec.decode("CrawlJob", payload, [("other", b"x")])


def test_unknown_fingerprint(codec: Codec) -> None:
    payload, _ = codec.encode("CrawlJob", JOB)
    with pytest.raises(DecodeError, match="unknown"):
        codec.decode("CrawlJob", payload, [(HEADER_SCHEMA, b"0123456789abcdef")])


def test_non_utf8_schema_header_is_a_decode_error(codec: Codec) -> None:
    """Found by fuzzing: the header's bytes were decoded strictly (UnicodeDecodeError)."""
    payload, _ = codec.encode("CrawlJob", JOB)
    with pytest.raises(DecodeError, match="unknown"):
        codec.decode("CrawlJob", payload, [(HEADER_SCHEMA, b"\x80\xff")])


def test_header_found_among_others(codec: Codec) -> None:
    payload, headers = codec.encode("CrawlJob", JOB)
    assert codec.decode("CrawlJob", payload, [("cf-target", b"example.com"), *headers]) == JOB


@pytest.mark.parametrize("mangle", [
    lambda p: p[: len(p) // 2],  # truncated
    lambda p: b"",
    lambda p: b"\xff" * 12,  # varint never terminates / absurd lengths
    lambda p: b"\x7f" + p[1:],  # string length far beyond the payload
])
def test_corrupt_payload(codec: Codec, mangle: Any) -> None:
    payload, headers = codec.encode("CrawlJob", JOB)
    with pytest.raises(DecodeError, match="corrupt"):
        codec.decode("CrawlJob", mangle(payload), headers)


def test_none_payload(codec: Codec) -> None:
    _, headers = codec.encode("CrawlJob", JOB)
    with pytest.raises(DecodeError):
        codec.decode("CrawlJob", None, headers)


def test_record_of_another_type(codec: Codec) -> None:
    payload, headers = codec.encode("Seen", {"state": "DONE", "attempt": 0, "status": 200})
    with pytest.raises(DecodeError, match="Seen"):
        codec.decode("CrawlJob", payload, headers)


def test_decode_error_is_fatal_with_reason() -> None:
    err = DecodeError("x")
    assert not err.retryable
    assert err.reason == "undecodable"


def test_a_v7_page_reads_with_no_next_visit(codec: Codec) -> None:
    """A page parsed before ParsedPage v8 reads as planning no next visit (0): its
    page_visits row has none due, never a made-up one."""
    v7 = next(v for v in codec.versions("ParsedPage") if v.version == 7)
    page = {k: v for k, v in parsed_page().items() if k != "next_visit_ms"}
    payload, headers = codec.encode("ParsedPage", page, version=v7)
    decoded = codec.decode("ParsedPage", payload, headers)
    assert decoded["next_visit_ms"] == 0
    assert {k: v for k, v in decoded.items() if k != "next_visit_ms"} == \
        _with_ts(page, "fetched_at_ms", "parsed_at_ms")


def test_an_older_page_read_as_the_newest_has_no_body() -> None:
    """ParsedPage v7's body_z (bytes, default ""): a v6 page read as v7 carries an empty
    one (fastavro hands the JSON default, a str: the WARC sink reads any empty value as
    "no body travelled"), never a body."""
    codec = default_codec()
    v6 = next(v for v in codec.versions("ParsedPage") if v.version == 6)
    old, old_headers = codec.encode("ParsedPage", parsed_page(), v6)
    assert not codec.decode("ParsedPage", old, old_headers)["body_z"]
