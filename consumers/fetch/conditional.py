"""Conditional GET (issue 45): what a revisit sends from its last visit's answer, and what
an answer gives the next visit.

A page's validators (``CrawlJob.validators``, CrawlJob v4) are the last visit's ``etag``
and ``last_modified`` (sent back as ``If-None-Match`` / ``If-Modified-Since``, RFC 9110
13.1) and its text ``signature`` (``consumers.signature``: decides "changed" where a
server sends no validators). A 304 answer to a request that sent one is a visit with
outcome ``not_modified``: no body, nothing re-parsed or re-emitted.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The validator names a job and a fetch result carry.
ETAG, LAST_MODIFIED, SIGNATURE = "etag", "last_modified", "signature"
#: Longest validator kept: a server's header is not ours to store without bound.
MAX_VALIDATOR_CHARS = 512
NOT_MODIFIED = 304
#: The outcome (and reason) of a visit answered 304: unchanged since the last one.
NOT_MODIFIED_OUTCOME = "not_modified"


def request_headers(validators: Mapping[str, str] | None) -> dict[str, str]:
    """The conditional headers of a revisit from its last visit's validators (none for a
    first visit, or for a server that sent no validators)."""
    if not validators:
        return {}
    out = {}
    if validators.get(ETAG):
        out["If-None-Match"] = validators[ETAG]
    if validators.get(LAST_MODIFIED):
        out["If-Modified-Since"] = validators[LAST_MODIFIED]
    return out


def response_validators(etag: str | None, last_modified: str | None) -> dict[str, str]:
    """What an answer's ``ETag`` and ``Last-Modified`` give the page's next visit; a value
    too long or holding a line break (never valid in a header we send back) is dropped."""
    out = {}
    for name, value in ((ETAG, etag), (LAST_MODIFIED, last_modified)):
        if value and len(value) <= MAX_VALIDATOR_CHARS and value.isprintable():
            out[name] = value.strip()
    return out


def is_conditional(validators: Mapping[str, str] | None) -> bool:
    """Whether a request sent with these validators was conditional (a 304 means
    unchanged only then)."""
    return bool(request_headers(validators))
