"""The bottom of the import contract: configuration (one validated object), URL and
target rules, crawl windows, the one time format, the version tuple, and the root exception
type with its retryable/fatal split. Everything else imports these; these import nothing of
crawlfleet's."""

__version__ = "0.1.0"
