"""One place maps fetch exceptions to failure classes, by type: every class, and retries
only for the classes a later attempt can fix."""

from __future__ import annotations

import itertools
import ssl

import aiohttp
import pytest
from aiohttp import http_exceptions as hx
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from consumers.fetch.classify import classify_exception
from core.errors import (
    CrawlfleetError,
    DecompressionBombError,
    ForbiddenAddressError,
    InternalError,
    ResponseTooLargeError,
    TooManyRedirectsError,
)

_INFO = aiohttp.RequestInfo(URL("http://a.test/"), "GET", CIMultiDictProxy(CIMultiDict()),
                            URL("http://a.test/"))


def _chain(*excs: BaseException) -> BaseException:
    """excs[0] raised from excs[1] raised from ... (as aiohttp chains parser errors)."""
    for outer, inner in itertools.pairwise(excs):
        outer.__cause__ = inner
    return excs[0]


def _parser(err: BaseException) -> BaseException:
    """What aiohttp raises for a parser error: ClientResponseError ← a copy ← the error."""
    copy = hx.HttpProcessingError(code=400, message="copied")
    return _chain(aiohttp.ClientResponseError(_INFO, (), status=400, message="bad"), copy, err)


CASES: list[tuple[str, BaseException, str]] = [
    ("wrong Content-Length", _chain(aiohttp.ClientPayloadError("not completed"),
                                    hx.ContentLengthError("5 of 1000")), "truncated_body"),
    ("chunked body cut short", _chain(aiohttp.ClientPayloadError("not completed"),
                                      hx.TransferEncodingError("cut")), "truncated_body"),
    ("connection lost mid-body", aiohttp.ClientPayloadError("not completed"),
     "truncated_body"),
    ("garbage status line", _parser(hx.BadStatusLine("FOO BAR")), "protocol_error"),
    ("HTTP/0.9 answer", _parser(hx.BadStatusLine("<html>")), "protocol_error"),
    ("broken chunk size", _parser(hx.BadHttpMessage("Invalid chunk size")), "protocol_error"),
    ("too many headers", _parser(hx.BadHttpMessage("Too many headers")), "protocol_error"),
    ("duplicate Content-Length", _parser(hx.BadHttpMessage("dup")), "protocol_error"),
    ("bad gzip", _chain(aiohttp.ClientPayloadError("x"), hx.ContentEncodingError("gzip")),
     "protocol_error"),
    ("header line too long", _parser(hx.LineTooLong(b"aaaa", "8190")), "headers_too_large"),
    ("total timeout", TimeoutError(), "timeout"),
    ("read timeout", aiohttp.ServerTimeoutError("read"), "timeout"),
    ("refused", ConnectionRefusedError(111, "refused"), "connect"),
    ("closed without answer", aiohttp.ServerDisconnectedError(), "connect"),
    ("reset", aiohttp.ClientOSError(104, "reset"), "connect"),
    ("certificate", ssl.SSLCertVerificationError("bad cert"), "tls"),
    ("tls inside a connect error", _chain(aiohttp.ClientOSError(1, "x"),
                                          ssl.SSLError("handshake")), "tls"),
    ("fingerprint", aiohttp.ServerFingerprintMismatch(b"a", b"b", "h", 443), "tls"),
    ("bad URL", aiohttp.InvalidURL("http://[::1"), "invalid_url"),
    ("a bug", KeyError("oops"), "internal"),
    ("proxy refused the tunnel", aiohttp.ClientHttpProxyError(_INFO, (), status=407),
     "proxy"),
    ("proxy unreachable", aiohttp.ClientProxyConnectionError(
        aiohttp.client_reqrep.ConnectionKey("p", 1, False, True, None, None, None),
        OSError(111, "refused")), "connect"),
    ("refused address from the resolver",
     _chain(aiohttp.ClientConnectionError("x"), ForbiddenAddressError("127.0.0.1")),
     "address_not_allowed"),
]


@pytest.mark.parametrize(("what", "exc", "reason"), CASES, ids=[c[0] for c in CASES])
def test_each_exception_has_its_class(what: str, exc: BaseException, reason: str) -> None:
    out = classify_exception(exc, "http://a.test/")
    assert isinstance(out, CrawlfleetError)
    assert out.reason == reason, what


def test_our_own_errors_pass_through_unchanged() -> None:
    err = ResponseTooLargeError("big")
    assert classify_exception(err) is err


def test_unexpected_exceptions_name_their_type() -> None:
    out = classify_exception(ZeroDivisionError("division by zero"), "http://a.test/x")
    assert isinstance(out, InternalError)
    assert "ZeroDivisionError" in str(out) and "http://a.test/x" in str(out)


#: Classes a later attempt can fix: the server or network may answer in full next time.
RETRYABLE = {"truncated_body", "timeout", "connect", "proxy"}


def test_only_transient_classes_are_retried() -> None:
    reasons = {classify_exception(exc).reason: classify_exception(exc).retryable
               for _, exc, _ in CASES}
    for cls in (DecompressionBombError, TooManyRedirectsError, ResponseTooLargeError):
        reasons[cls.reason] = cls("x").retryable
    assert {r for r, retry in reasons.items() if retry} == RETRYABLE
    assert {"protocol_error", "headers_too_large", "tls", "too_large", "decompression_bomb",
            "redirect_loop", "address_not_allowed", "internal"} <= set(reasons)


def test_internal_error_wraps_any_exception() -> None:
    err = InternalError.wrap(UnicodeError("label empty"), "parsing 'http://a.test/'")
    assert err.reason == "internal" and not err.retryable
    assert str(err).startswith("UnicodeError while parsing")
