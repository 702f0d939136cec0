"""What a visit is in a WARC archive, decided the same way by the parse stage (which carries
the decision forward to the next visit) and the store's WARC sink (which writes it).

A visit is archived as one of three captures:

* ``response`` -- its full answer (a first visit, a changed page, any status but a 304);
* ``server-not-modified`` -- a revisit record for a 304 to a conditional GET;
* ``identical-payload-digest`` -- a revisit record for a 200 whose body is, byte for byte
  (SHA-1), the last stored response's. A page "unchanged" by its text signature whose bytes
  differ (a new timestamp) is archived as a response: a revisit record would claim bytes
  the archive never holds.

Record ids are UUID-5s of the visit's identity (dedupe key, visit number, record type),
never random: a batch written again after a store kill produces the same records, and a
revisit names the id of the response it refers to without asking anyone. The last stored
response (id, URI, date, digest) travels in the visit's validators (``warc_*`` keys) to the
page's next visit, whose ParsedPage carries it as ``last_capture``.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from consumers.fetch.conditional import NOT_MODIFIED

RESPONSE = "response"
SERVER_NOT_MODIFIED = "server-not-modified"
IDENTICAL_PAYLOAD = "identical-payload-digest"
#: The revisit profiles' URIs (WARC 1.0, section 6.7).
PROFILE_URIS = {
    SERVER_NOT_MODIFIED: "http://netpreserve.org/warc/1.0/revisit/server-not-modified",
    IDENTICAL_PAYLOAD: "http://netpreserve.org/warc/1.0/revisit/identical-payload-digest"}
#: The fields of a stored response a revisit refers to, and their validator keys.
CAPTURE_FIELDS = ("id", "uri", "date", "digest")
_KEY = {f: f"warc_{f}" for f in CAPTURE_FIELDS}
#: The namespace of every record id crawlfleet writes (uuid5).
_NAMESPACE = uuid.UUID("6f3b1c1e-45a5-4c1b-9d7e-0c2a4f1e5a45")


def record_id(dedupe_key: str, visit: int, kind: str) -> str:
    """The WARC-Record-ID of one record of a visit (``kind``: request, response, revisit,
    or a file's warcinfo with the file's own key)."""
    return f"<urn:uuid:{uuid.uuid5(_NAMESPACE, f'{dedupe_key}|{visit}|{kind}')}>"


def payload_digest(body: bytes) -> str:
    """WARC-Payload-Digest: ``sha1:`` and the base32 SHA-1 of the body."""
    return "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode()  # noqa: S324


def warc_date(ms: int | datetime) -> str:
    """WARC-Date (WARC 1.0: seconds, UTC) of a record's epoch milliseconds."""
    when = ms if isinstance(ms, datetime) else datetime.fromtimestamp(ms / 1000, UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def capture_kind(status: int, visit: int, digest: str, last: Mapping[str, str]) -> str:
    """How a visit is archived (see the module's docstring)."""
    if status == NOT_MODIFIED and visit > 0:
        return SERVER_NOT_MODIFIED
    if visit > 0 and digest and last.get("digest") == digest:
        return IDENTICAL_PAYLOAD
    return RESPONSE


def last_capture(validators: Mapping[str, str] | None) -> dict[str, str]:
    """The last stored response named by a job's validators (empty: none was archived)."""
    v = validators or {}
    return {f: v[_KEY[f]] for f in CAPTURE_FIELDS if v.get(_KEY[f])}


def carried(dedupe_key: str, visit: int, status: int, uri: str, fetched_at: int | datetime,
            digest: str, last: Mapping[str, str]) -> dict[str, str]:
    """The ``warc_*`` validators this visit hands the next one: itself if it is archived as
    a response, else the response it refers to."""
    if capture_kind(status, visit, digest, last) != RESPONSE:
        return {_KEY[f]: last[f] for f in CAPTURE_FIELDS if f in last}
    mine = {"id": record_id(dedupe_key, visit, RESPONSE), "uri": uri,
            "date": warc_date(fetched_at), "digest": digest}
    return {_KEY[f]: v for f, v in mine.items() if v}
