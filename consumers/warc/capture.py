"""What the parse stage puts in a ParsedPage (v7) for the store's WARC sink.

The store reads ``crawl.parsed`` only, so a page carries its exchange (FetchResult v5: the
status line and headers, the request as sent) and, with ``warc_dir`` set, its body: zlib-
compressed (level 1: HTML shrinks 4-8 times at ~100 MB/s), so a page can also be parsed
again later without fetching it again. Without ``warc_dir`` no body travels (the topic
carries only the text, as before). Size: a body is at most ``max_response_bytes`` (5 MiB by
default), so a page's text plus its compressed body fit the 16 MiB ``max.message.bytes`` of
``crawl.parsed`` while ``max_response_bytes`` is at most 7 MiB (checked in Settings).
"""

from __future__ import annotations

import zlib

from consumers.warc.refs import carried, last_capture, payload_digest
from schemas.keys import page_key
from schemas.records import CaptureFields, FetchResult

#: zlib level of a kept body: fast, most of the gain (HTML).
BODY_LEVEL = 1


def page_fields(result: FetchResult, keep_body: bool) -> CaptureFields:
    """The ParsedPage v7 fields of a fetched page: none unless the store archives it
    (``keep_body``), so a crawl without WARC output carries nothing more than before."""
    body = result["body"]
    if not keep_body:
        return {"status_line": "", "response_headers": [], "request_method": "",
                "request_url": "", "request_headers": [], "body_z": b"", "payload_digest": "",
                "last_capture": {}}
    return {"status_line": result.get("status_line", ""),
            "response_headers": result.get("response_headers") or [],
            "request_method": result.get("request_method", ""),
            "request_url": result.get("request_url", ""),
            "request_headers": result.get("request_headers") or [],
            "body_z": zlib.compress(body, BODY_LEVEL) if body else b"",
            "payload_digest": payload_digest(body) if body else "",
            "last_capture": last_capture(result["job"].get("validators"))}


def next_validators(result: FetchResult) -> dict[str, str]:
    """The ``warc_*`` validators the page's next visit carries (see ``refs.carried``)."""
    job, body = result["job"], result["body"]
    return carried(page_key(job), int(job.get("visit") or 0), result["status"], job["url"],
                   result["fetched_at_ms"], payload_digest(body) if body else "",
                   last_capture(job.get("validators")))
