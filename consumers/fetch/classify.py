"""Failure classification in one place: what an HTTP answer means for the job.

Retry rules are data (the tables below), the attempt count travels on the job, and unknown
statuses are classified explicitly instead of trusting ranges (aiohttp accepts ``042``).
"""

from __future__ import annotations

import email.utils
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

import aiohttp
from aiohttp import http_exceptions as hx

from core.config import MAX_RETRY_DELAY_S
from core.errors import (
    ConnectError,
    CrawlfleetError,
    FetchTimeoutError,
    HeadersTooLargeError,
    InternalError,
    InvalidURLError,
    ProtocolError,
    ProxyError,
    ResponseTooLargeError,
    TLSError,
    TooManyRedirectsError,
    TruncatedBodyError,
)

#: Statuses worth another try later, with the back-off they imply.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524})
#: Statuses that block us unless configured otherwise (``block_statuses``).
DEFAULT_BLOCK_STATUSES = frozenset({403})
#: 407 Proxy Authentication Required: a forward proxy's answer (see ``classify_status``).
PROXY_AUTH_STATUS = 407
BASE_BACKOFF_S = 2.0
MAX_BACKOFF_S = 600.0


class Signal(Enum):
    """What one finished request says about its target (see ``consumers.fetch.adaptive``)."""

    OK = "ok"  # a definitive answer: 2xx, 404 ...
    ERROR = "error"  # 5xx, timeout, connection error: the site may be struggling
    BLOCKED = "blocked"  # 403 and the configured block statuses: the site pushes back
    THROTTLED = "throttled"  # 429: the site asks for fewer requests
    NEUTRAL = "neutral"  # says nothing about the site (robots.txt, our own refusal)


class Verdict(Enum):
    STORE = "store"  # a final answer (2xx, or a definitive 4xx such as 404)
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str
    delay_s: float = 0.0  # how long this job waits before its next attempt
    signal: Signal = Signal.OK  # what the answer says about the target
    retry_after_s: float | None = None  # the site's own Retry-After: rest the target

    @property
    def blocked(self) -> bool:
        return self.signal is Signal.BLOCKED


def classify_status(status: int, retry_after: str | None, attempt: int,
                    now: datetime | None = None,
                    block_statuses: frozenset[int] = DEFAULT_BLOCK_STATUSES) -> Outcome:
    """What to do with a response of ``status`` on attempt number ``attempt`` (0-based).

    A block status is stored (it is the site's answer for that URL) but never counts as a
    success; a retryable status retries the job only, after its own back-off: the target as
    a whole is slowed by the signal, and rested only for a Retry-After or repeated errors.
    """
    if not 100 <= status <= 599:  # "HTTP/1.1 042": a prompt answer, broken bytes (see
        return Outcome(Verdict.DEAD, "protocol_error", signal=answered_signal())  # below)
    if 200 <= status <= 299:
        return Outcome(Verdict.STORE, "ok")
    if status == PROXY_AUTH_STATUS:
        # The proxy's answer, not the site's: never stored as the page, and no signal
        # about the target (the egress's health counts it); retried, on another egress
        # when the pool has one.
        return Outcome(Verdict.RETRY, f"http_{status}", backoff(attempt), Signal.NEUTRAL)
    if status in block_statuses:
        return Outcome(Verdict.STORE, f"http_{status}", signal=Signal.BLOCKED)
    if status in RETRY_STATUSES or 500 <= status <= 599:
        wait = parse_retry_after(retry_after, now) if retry_after else None
        return Outcome(Verdict.RETRY, f"http_{status}",
                       wait if wait is not None else backoff(attempt),
                       Signal.THROTTLED if status == 429 else Signal.ERROR, wait)
    if 400 <= status <= 499:
        return Outcome(Verdict.STORE, f"http_{status}")
    # 1xx/3xx reaching here: a redirect with a Location is a job of its own (see
    # ``OutcomeRules.redirect``); a 3xx without one, or a final 1xx, is odd.
    return Outcome(Verdict.DEAD, f"unexpected_{status}", signal=Signal.ERROR)


def answered_signal() -> Signal:
    """What an answer that came but cannot be used (a bad status line, broken framing,
    too large, a bomb, a redirect loop) says of its target: it answers, so it is not
    struggling. Such a page is dead-lettered; its site is not slowed for it."""
    return Signal.OK


def error_signal(exc: CrawlfleetError) -> Signal:
    """What a request that raised ``exc`` says of its target: a timeout, a refused or
    reset connection or a body cut short may be a struggling site (``ERROR``); a prompt
    answer with broken bytes is not (:func:`answered_signal`); our own refusals (address,
    robots.txt, bad URL) and anything else say nothing (``NEUTRAL``)."""
    if isinstance(exc, FetchTimeoutError | ConnectError | TruncatedBodyError):
        return Signal.ERROR
    if isinstance(exc, ProtocolError | ResponseTooLargeError | TooManyRedirectsError):
        return answered_signal()
    return Signal.NEUTRAL


def backoff(attempt: int) -> float:
    """Exponential back-off for attempt ``attempt`` (0-based), capped."""
    exponent = min(max(0, attempt), 64)  # 2.0 * 2**1024 would overflow a float
    return float(min(MAX_BACKOFF_S, BASE_BACKOFF_S * (2 ** exponent)))


def parse_retry_after(value: str, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date)."""
    value = value.strip()
    # ASCII only ("²".isdigit() but int() rejects it); float() has no digit-count limit.
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_DELAY_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, min(delta, MAX_RETRY_DELAY_S))


def classify_exception(exc: BaseException, url: str = "") -> CrawlfleetError:
    """The failure class of an exception raised while fetching ``url``: the one place that
    maps the HTTP client's exceptions to reasons, by type (never by message text).

    aiohttp re-wraps parser errors (``ClientResponseError`` ← ``HttpProcessingError`` ←
    the parser's own ``LineTooLong``, ``BadStatusLine`` ...), so the cause chain is read
    for the most specific type. Only ``truncated_body``, ``timeout``, ``connect`` and
    ``proxy`` are worth a retry; anything not foreseen is ``internal``, never a crash.
    """
    where = f" fetching {url}" if url else ""
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, CrawlfleetError):
            return e
    detail = f"{type(exc).__name__}{where}: {_detail(chain)}"[:2000]
    if any(isinstance(e, aiohttp.ClientSSLError | ssl.SSLError
                      | aiohttp.ServerFingerprintMismatch) for e in chain):
        return TLSError(detail)
    # Most specific first, over the whole chain (aiohttp's copy is a plain HttpProcessingError).
    if any(isinstance(e, aiohttp.ClientHttpProxyError) for e in chain):
        return ProxyError(detail)  # the proxy refused the tunnel (407, 502 ...)
    if any(isinstance(e, hx.LineTooLong) for e in chain):
        return HeadersTooLargeError(detail)
    if any(isinstance(e, hx.ContentLengthError | hx.TransferEncodingError) for e in chain):
        return TruncatedBodyError(detail)  # the body stopped before its framing's end
    if any(isinstance(e, hx.HttpProcessingError) for e in chain):
        return ProtocolError(detail)  # bad status line, HTTP/0.9, chunk sizes, encoding
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one too
        return FetchTimeoutError(detail)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return TruncatedBodyError(detail)  # payload not completed: connection lost mid-body
    if isinstance(exc, aiohttp.InvalidURL | ValueError):
        return InvalidURLError(detail)
    if isinstance(exc, aiohttp.ClientResponseError):
        return ProtocolError(detail)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return ConnectError(detail)  # refused, reset, unreachable, no answer at all
    return InternalError(detail)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 16:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _detail(chain: list[BaseException]) -> str:
    last = chain[-1]
    msg = getattr(last, "message", None) or str(last)
    return f"{type(last).__name__}: {msg}".replace("\n", " ")
