"""Who may talk to the dashboard: pure checks on a request's headers, apart from the server.

The page is closed by default, like Jupyter's: a token printed once in the URL, then kept in
an HttpOnly, SameSite=Strict cookie. Beyond the token, a request must name a loopback host
(so a DNS-rebound name cannot pass for us), and any Origin, Referer or Sec-Fetch-Site it
carries must be our own origin (another site's page cannot drive the endpoints).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

#: Host names the page answers under: the loopback names, reached locally or via a tunnel.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
TOKEN_PARAM = "token"  # noqa: S105 - a parameter name, not a secret


def new_token() -> str:
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    """One cookie per port: cookies are not kept apart by port, two dashboards would be."""
    return f"crawlfleet_dashboard_{port}"


def cookie_header(port: int, token: str) -> str:
    """The ``Set-Cookie`` value: never readable by a script, never sent cross-site."""
    return f"{cookie_name(port)}={token}; Path=/; HttpOnly; SameSite=Strict"


def token_ok(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _host_name(host: str) -> str:
    """``127.0.0.1:8765`` → ``127.0.0.1``; ``[::1]:8765`` → ``[::1]``."""
    if host.startswith("["):
        return host[:host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def refusal(headers: Mapping[str, str], cookies: Mapping[str, str],
            query: Mapping[str, str], token: str, port: int) -> str:
    """Why a request is refused (``""``: let it through). Header names case-insensitive
    as aiohttp's ``request.headers`` is; ``query`` may carry the first load's token."""
    host = headers.get("Host", "")
    if _host_name(host.lower()) not in LOOPBACK_NAMES:
        return f"this dashboard answers on 127.0.0.1 only, not {host[:60]!r}"
    own = f"http://{host.lower()}"
    origin = headers.get("Origin")
    if origin is not None and origin.lower() != own:
        return "a request from another origin"
    referer = headers.get("Referer")
    if referer is not None and _origin_of(referer) != own:
        return "a request referred by another origin"
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a {site} request"
    if not (token_ok(cookies.get(cookie_name(port)), token)
            or token_ok(query.get(TOKEN_PARAM), token)):
        return ("no valid token: open the URL `crawlfleet dashboard` printed "
                "(…/?token=…) once; the page keeps it in a cookie")
    return ""


def _origin_of(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return f"{parts.scheme}://{parts.netloc}".lower()
