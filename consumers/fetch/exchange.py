"""What a fetch keeps of its HTTP exchange for a WARC record (FetchResult v5, issue 45.5):
the status line and headers as received, and the request as sent.

Secrets never leave the fetch worker: the values of ``Authorization``,
``Proxy-Authorization`` and ``Cookie`` (the request's) and of ``Set-Cookie`` (the answer's:
our session with the site) become ``[redacted]``, the header's name kept so an archive still
shows one was sent. Header bytes that are not UTF-8 become U+FFFD, as every header text the
fetch stage keeps (:func:`consumers.fetch.http.header_text`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.records import ExchangeFields

#: Headers whose values are credentials: kept by name, never by value.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Exchange:
    """One request and its answer, as a WARC request/response record pair needs them."""

    status_line: str = ""
    response_headers: list[list[str]] = field(default_factory=list)
    request_method: str = ""
    request_url: str = ""
    request_headers: list[list[str]] = field(default_factory=list)

    def fields(self) -> ExchangeFields:
        """The FetchResult v5 fields."""
        return {"status_line": self.status_line, "response_headers": self.response_headers,
                "request_method": self.request_method, "request_url": self.request_url,
                "request_headers": self.request_headers}


def _text(value: str | bytes) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def redacted(pairs: Iterable[tuple[str | bytes, str | bytes]]) -> list[list[str]]:
    """``[name, value]`` pairs in order, duplicates kept, secret values redacted."""
    out = []
    for name, value in pairs:
        n = _text(name)
        out.append([n, REDACTED if n.lower() in SECRET_HEADERS else _text(value)])
    return out


def status_line(version: Any, status: int, reason: str | None) -> str:
    """``HTTP/1.1 200 OK`` from aiohttp's response version, status and reason."""
    major, minor = (getattr(version, "major", 1), getattr(version, "minor", 1))
    return f"HTTP/{major}.{minor} {status} {_text(reason or '')}".rstrip()


def exchange_of(resp: Any, url: str) -> Exchange:
    """The exchange of an aiohttp response to the GET of ``url`` (the crawl URL: through a
    proxy the request went to the checked address, with the name as its Host header)."""
    info = resp.request_info
    return Exchange(status_line(resp.version, resp.status, resp.reason),
                    redacted(resp.raw_headers), str(info.method), url,
                    redacted(info.headers.items()))
