"""WARC records of a stored page (pure: bytes in, bytes out; no file, no clock).

A page (ParsedPage v7) becomes one gzip member per record (as Common Crawl and pywb read
them): its ``response`` -- or a ``revisit`` record (``consumers.warc.refs``) -- then the
``request`` that asked for it (``WARC-Concurrent-To``). Every field comes from the record,
none from the clock or a random source: the same page at the same place gives the same
bytes, which is what lets a batch written again after a store kill replace what it had
written before (``consumers.warc.files``). Each record names the input record it came from
in ``Crawlfleet-Source: topic:partition:offset``.

The body a page carries is the one the fetcher read: decoded of its content and transfer
codings. Its ``Content-Encoding``, ``Transfer-Encoding`` and ``Content-Length`` headers are
kept as ``X-Crawlfleet-Orig-*`` and ``Content-Length`` gives the body's real length, so a
reader never tries to inflate or de-chunk a body that is neither. A page whose body did not
travel (``warc_dir`` unset at its parse worker) is written with an empty payload and
``WARC-Truncated: unspecified``.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from consumers.warc.refs import (
    IDENTICAL_PAYLOAD,
    PROFILE_URIS,
    RESPONSE,
    capture_kind,
    record_id,
    warc_date,
)
from core import __version__
from schemas.records import ParsedPage

SOURCE = "Crawlfleet-Source"
#: Headers that describe the wire form of a body the page no longer has.
_WIRE_HEADERS = ("content-encoding", "transfer-encoding", "content-length")
_ORIG = "X-Crawlfleet-Orig-"


#: gzip level of a record's member: warcio's own is 9; zlib's default 6 took a 12 KB page's
#: records from 3.0 ms to 1.0 ms (measured), 1% larger.
GZIP_LEVEL = 6


def _writer(out: io.BytesIO) -> WARCWriter:
    return WARCWriter(out, gzip=False, warc_version="1.0")


def _member(writer: WARCWriter, record: ArcWarcRecord) -> bytes:
    """One record as its own gzip member (zlib writes no time into the header)."""
    out: io.BytesIO = writer.out
    out.seek(0)
    out.truncate()
    writer.write_record(record)
    z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS + 16)
    return z.compress(out.getvalue()) + z.flush()


def _pairs(headers: Any) -> list[tuple[str, str]]:
    return [(str(h[0]), str(h[1])) for h in headers or () if len(h) == 2]


def response_headers(page: Mapping[str, Any], body_len: int) -> StatusAndHeaders:
    """The answer's status line and headers, as a decoded body needs them."""
    line = page.get("status_line") or f"HTTP/1.1 {page['status']}"
    protocol, _, status = line.partition(" ")
    pairs = _pairs(page.get("response_headers"))
    if not pairs and page.get("content_type"):  # a page from before FetchResult v5
        pairs = [("Content-Type", str(page["content_type"]))]
    rewritten = [(_ORIG + k if k.lower() in _WIRE_HEADERS else k, v) for k, v in pairs]
    if int(page["status"]) != 304:
        rewritten.append(("Content-Length", str(body_len)))
    return StatusAndHeaders(status, rewritten, protocol=protocol)


def request_headers(page: Mapping[str, Any]) -> StatusAndHeaders | None:
    """The request line and headers as sent (None from a page before FetchResult v5)."""
    if not page.get("request_method"):
        return None
    parts = urlsplit(page.get("request_url") or page["url"])
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return StatusAndHeaders(f"{page['request_method']} {target} HTTP/1.1",
                            _pairs(page.get("request_headers")), is_http_request=True)


def body_of(page: Mapping[str, Any]) -> bytes | None:
    """The page's body as fetched (None: it did not travel with the page)."""
    z = page.get("body_z")
    if z:
        return zlib.decompress(z)
    return b"" if not page.get("body_bytes") else None


def page_records(page: ParsedPage, source: str) -> bytes:
    """The gzip members of a page's records: its response or revisit, then its request."""
    key, visit = page["dedupe_key"], int(page.get("visit") or 0)
    uri = page.get("request_url") or page["url"]
    date = warc_date(page["fetched_at_ms"])
    last = page.get("last_capture") or {}
    kind = capture_kind(int(page["status"]), visit, page.get("payload_digest", ""), last)
    out = io.BytesIO()
    writer = _writer(out)
    common = {"WARC-Date": date, SOURCE: source}
    if kind == RESPONSE:
        body = body_of(page)
        main_id = record_id(key, visit, "response")
        fields = {**common, "WARC-Record-ID": main_id}
        if body is None:
            fields["WARC-Truncated"] = "unspecified"
        main = writer.create_warc_record(
            uri, "response", payload=io.BytesIO(body or b""), length=len(body or b""),
            http_headers=response_headers(page, len(body or b"")), warc_headers_dict=fields)
    else:
        main_id = record_id(key, visit, "revisit")
        fields = {**common, "WARC-Record-ID": main_id, "WARC-Profile": PROFILE_URIS[kind]}
        if last.get("id"):
            fields["WARC-Refers-To"] = last["id"]
        fields["WARC-Refers-To-Target-URI"] = last.get("uri") or uri
        if last.get("date"):
            fields["WARC-Refers-To-Date"] = last["date"]
        if kind == IDENTICAL_PAYLOAD:
            fields["WARC-Payload-Digest"] = page["payload_digest"]
        main = writer.create_warc_record(uri, "revisit", http_headers=response_headers(page, 0),
                                         warc_headers_dict=fields)
    members = [_member(writer, main)]
    request = request_headers(page)
    if request is not None:
        members.append(_member(writer, writer.create_warc_record(
            uri, "request", http_headers=request,
            warc_headers_dict={**common, "WARC-Record-ID": record_id(key, visit, "request"),
                               "WARC-Concurrent-To": main_id})))
    return b"".join(members)


def warcinfo(file_key: str, date: str) -> bytes:
    """A file's first record (its id from the file's key: the same file, the same bytes)."""
    out = io.BytesIO()
    writer = _writer(out)
    info = f"software: crawlfleet/{__version__}\r\nformat: WARC File Format 1.0\r\n".encode()
    record: ArcWarcRecord = writer.create_warc_record(
        "", "warcinfo", payload=io.BytesIO(info), length=len(info),
        warc_content_type="application/warc-fields",
        warc_headers_dict={"WARC-Record-ID": record_id(file_key, 0, "warcinfo"),
                           "WARC-Date": date})
    return _member(writer, record)
