"""The version tuple every fetch and every worker's metrics report: what a dashboard splits
success and block rates by (a new fetcher, HTTP library, TLS library or profile bundle)."""

from __future__ import annotations

import ssl
from importlib.metadata import version

from core import __version__
from core.config import Settings

FETCHER_VERSION = f"crawlfleet-fetch/{__version__}"
HTTP_LIB_VERSION = f"aiohttp/{version('aiohttp')}"
TLS_LIB_VERSION = ssl.OPENSSL_VERSION


def version_labels(settings: Settings) -> dict[str, str]:
    """The worker's version tuple, as telemetry reports it."""
    return {"version": __version__, "fetcher_version": FETCHER_VERSION,
            "http_version": HTTP_LIB_VERSION, "tls_version": TLS_LIB_VERSION,
            "profile_bundle_version": settings.profile_bundle_version,
            "code_revision": settings.code_revision}
