"""One root exception and an explicit retryable/fatal split.

Every failure a stage sees is classified once, here, by type: never by message text.
A ``RetryableError`` may succeed if tried again later (timeouts, 5xx, a broker hiccup);
a ``FatalError`` never will (a malformed URL, an undecodable record, a refused address).
"""

from __future__ import annotations


class CrawlfleetError(Exception):
    """Root of every error crawlfleet raises on purpose."""

    #: short machine-readable reason class, stored with dead letters and telemetry
    reason: str = "error"
    retryable: bool = False


class RetryableError(CrawlfleetError):
    """Worth trying again after a delay."""

    reason = "retryable"
    retryable = True


class FatalError(CrawlfleetError):
    """Trying again cannot help: dead-letter it with its reason."""

    reason = "fatal"
    retryable = False


class ConfigError(FatalError):
    """Configuration is invalid; the message says which setting and why."""

    reason = "config"


class UndeclaredTopicError(ConfigError):
    """A stage wrote a topic its declaration does not name among its outputs or its
    stores' changelogs: the topology graph would be wrong, so the write is refused."""

    reason = "undeclared_topic"


class InfraError(FatalError):
    """A local service (Kafka, Java, Maven, ClickHouse) could not be set up."""

    reason = "infra"


class QueryError(FatalError):
    """The store's engine refused a query (a typo, a missing table): its one-line reason."""

    reason = "query"


class InvalidURLError(FatalError):
    """A URL cannot be crawled: bad syntax, unsupported scheme, or refused address."""

    reason = "invalid_url"


class ForbiddenAddressError(InvalidURLError):
    """A URL resolves to a private, loopback or link-local address that is not allowed.

    Refused where the connection is made (every hop, every resolution); never retried:
    only a setting (``allow_hosts``, ``allow_private``) can change the answer.
    """

    reason = "address_not_allowed"


class ForbiddenRedirectError(ForbiddenAddressError):
    """A redirect followed from an allowed URL (robots.txt follows them) leads to an
    address that is not allowed: the URL asked for is fine, where it leads is refused."""


class DecodeError(FatalError):
    """A record could not be decoded with any known schema."""

    reason = "undecodable"


class RobotsDisallowedError(FatalError):
    """robots.txt disallows the URL for our user-agent."""

    reason = "robots_disallowed"


class ResponseTooLargeError(FatalError):
    """The (decompressed) response body exceeded the configured cap."""

    reason = "too_large"


class DecompressionBombError(ResponseTooLargeError):
    """A compressed body that inflates far beyond its size on the wire, past the cap."""

    reason = "decompression_bomb"


class SitemapError(FatalError):
    """A fetched sitemap that cannot be expanded (not XML, text or a feed; broken XML; a
    DTD or entity): dead-lettered whole, so no half-read list is taken for the site's."""

    reason = "sitemap_malformed"


class SitemapTooLargeError(ResponseTooLargeError):
    """A sitemap past its caps (decompressed bytes, entries): refused before parsing."""

    reason = "sitemap_too_large"


class SitemapTooDeepError(SitemapError):
    """A sitemap index nested past ``sitemap_max_depth``: the sub-sitemap is not fetched."""

    reason = "sitemap_too_deep"


class TooManyRedirectsError(FatalError):
    """The redirect chain exceeded the configured cap (or came back to where it started)."""

    reason = "redirect_loop"


class TruncatedBodyError(RetryableError):
    """The connection closed before the body its framing announced (Content-Length or an
    unfinished chunk) was complete: another try may get all of it."""

    reason = "truncated_body"


class ProtocolError(FatalError):
    """The answer is not valid HTTP/1.1: a garbage status line, an HTTP/0.9 reply, broken
    chunk framing, conflicting lengths or undecodable content-encoding."""

    reason = "protocol_error"


class HeadersTooLargeError(ProtocolError):
    """A status or header line longer than the parser's cap."""

    reason = "headers_too_large"


class TLSError(FatalError):
    """The TLS handshake failed or the certificate was not valid for the host."""

    reason = "tls"


class InternalError(FatalError):
    """An unexpected exception while handling one record (a bug or an input nobody
    foresaw): that record is dead-lettered with the exception type, the stage goes on."""

    reason = "internal"

    @classmethod
    def wrap(cls, exc: BaseException, what: str) -> InternalError:
        return cls(f"{type(exc).__name__} while {what}: {exc}"[:2000])


class FetchTimeoutError(RetryableError):
    """The request did not complete within its total time budget."""

    reason = "timeout"


class ConnectError(RetryableError):
    """The connection could not be established or was reset."""

    reason = "connect"


class ProxyError(RetryableError):
    """The forward proxy refused to carry the request (it answered the CONNECT with an
    error, 407 included): the egress's fault, not the target's; another try may take
    another egress."""

    reason = "proxy"


class ServerError(RetryableError):
    """The server answered 5xx (or 429): try later, more gently."""

    reason = "server_error"


class KafkaStageError(RetryableError):
    """A retriable Kafka error surfaced to a stage."""

    reason = "kafka"
