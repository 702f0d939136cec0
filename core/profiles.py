"""Crawl identities: profiles and the egresses they may leave through, from configuration.

A *profile* is who the crawler says it is to a site: an honest User-Agent (product token and
a contact URL, never a browser's), extra headers, a region, the egresses it may use, whether
it keeps cookies (a jar per target and profile, never shared) and the version of its bundle.
An *egress* is a way out: ``direct`` (this machine) or a forward proxy. A profile never
leaves its region: every egress of its pool must carry the profile's region, or the
configuration is refused at load.

Configuration (TOML)::

    [profiles.research]
    user_agent = "examplebot/2.1 (+https://example.org/bot)"
    headers = {From = "crawl@example.org"}
    region = "eu"
    egress = ["eu-proxy-1", "direct"]
    cookies = true
    bundle_version = "3"

    [egress.eu-proxy-1]
    proxy = "http://user:secret@10.0.0.5:3128"
    region = "eu"

``direct`` always exists, in the region ``region`` (the setting) names. With no profiles
configured there is one, ``default_profile``, built from ``user_agent``, ``robots_agent`` and
``profile_bundle_version``: a crawl that names no profile behaves as it always did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from core.errors import ConfigError, FatalError

#: The job's ``meta`` key carrying the egress its last attempt used (the retry keeps it).
EGRESS_META = "egress"

DIRECT = "direct"
#: Headers a profile may not set: the request's own (Host, Cookie: the jar's), and the
#: User-Agent, which is the profile's ``user_agent``.
RESERVED_HEADERS = frozenset({"host", "cookie", "user-agent", "content-length",
                              "transfer-encoding", "connection", "proxy-authorization"})
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TOKEN_RE = re.compile(r"[A-Za-z0-9_.-]+")
_PROFILE_KEYS = frozenset({"user_agent", "robots_token", "headers", "region", "egress",
                           "cookies", "bundle_version", "targets", "follow_sitemaps"})
_EGRESS_KEYS = frozenset({"proxy", "region"})


def valid_name(name: str) -> bool:
    """Whether ``name`` can name a profile or an egress (never ``*``, the unpinned key's)."""
    return bool(_NAME_RE.fullmatch(name))


def redact_url(url: str) -> str:
    """``url`` with its credentials hidden (proxy URLs in logs, errors and listings): a
    password becomes ``***``, and so does a user name given without one (a token)."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return urlunsplit((parts.scheme, f"{shown}@{hostport}", parts.path, parts.query,
                       parts.fragment))


@dataclass(frozen=True)
class Egress:
    """One way out: ``proxy`` empty means direct. ``repr`` never shows a password."""

    name: str
    region: str
    proxy: str = field(default="", repr=False)

    @property
    def direct(self) -> bool:
        return not self.proxy

    @property
    def shown(self) -> str:
        """The proxy URL as logs and ``crawlfleet profiles`` show it (password redacted)."""
        return redact_url(self.proxy) if self.proxy else "direct"

    def __repr__(self) -> str:
        return f"Egress(name={self.name!r}, region={self.region!r}, proxy={self.shown!r})"


@dataclass(frozen=True)
class Profile:
    """One crawl identity. ``targets`` empty: allowed for every target."""

    name: str
    user_agent: str
    robots_token: str
    region: str
    egress: tuple[str, ...] = (DIRECT,)
    headers: tuple[tuple[str, str], ...] = ()
    cookies: bool = False
    bundle_version: str = "1"
    targets: tuple[str, ...] = ()
    #: Its robots.txt fetches publish the file's ``Sitemap:`` lines as sitemap jobs.
    follow_sitemaps: bool = False

    def allowed_for(self, target: str) -> bool:
        return not self.targets or target in self.targets

    def request_headers(self) -> dict[str, str]:
        """What every request of this profile sends besides the request's own headers."""
        return {"User-Agent": self.user_agent, **dict(self.headers)}


def product_token(user_agent: str) -> str:
    """The robots.txt token of a User-Agent: its product name (``examplebot/2.1 (...)`` →
    ``examplebot``), which is what a site's ``User-agent:`` lines name."""
    first = user_agent.strip().split(" ", 1)[0]
    return first.split("/", 1)[0]


def user_agent_problem(ua: str) -> str | None:
    """Why ``ua`` is not an honest crawler User-Agent, or None."""
    if not ua.strip():
        return "is empty"
    if ua.lstrip().lower().startswith("mozilla/"):
        return ("looks like a browser's (starts with Mozilla/): a crawler says what it is, "
                "e.g. 'examplebot/1.0 (+https://example.org/bot)'")
    if not _TOKEN_RE.fullmatch(product_token(ua)):
        return "must start with a product token, e.g. 'examplebot/1.0'"
    if not re.search(r"(https?://|mailto:|@)", ua):
        return ("has no contact: add a URL or address where a site owner can reach you, e.g. "
                "'(+https://example.org/bot)'")
    return None


def _check_table(where: str, name: str, spec: Any, keys: frozenset[str], shape: str) -> None:
    """A named table of the configuration: a valid name, a table, only keys it knows."""
    if not valid_name(name):
        raise ConfigError(f"{where}: a name is letters, digits, '.', '_' or '-'")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected {shape}")
    unknown = set(spec) - keys
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; expected "
                          f"{sorted(keys)}")


def parse_egress(raw: Mapping[str, Any]) -> dict[str, Egress]:
    """Egress tables by name (``direct`` is built in and may not be redefined)."""
    out: dict[str, Egress] = {}
    for name, spec in raw.items():
        where = f"egress[{name!r}]"
        if name == DIRECT:
            raise ConfigError(f"{where}: 'direct' is built in (its region is the 'region' "
                              "setting)")
        _check_table(where, name, spec, _EGRESS_KEYS, "a table with 'proxy' and 'region'")
        proxy = str(spec.get("proxy") or "")
        parts = urlsplit(proxy)
        try:
            parts.port  # noqa: B018 -- raises on a port that is not a number
        except ValueError:
            raise ConfigError(f"{where}: proxy {redact_url(proxy)!r} has a bad port") from None
        if parts.scheme not in ("http",) or not parts.hostname:
            raise ConfigError(f"{where}: proxy must be an http:// URL of a forward proxy, not "
                              f"{redact_url(proxy)!r}")
        region = str(spec.get("region") or "")
        if not region:
            raise ConfigError(f"{where}: needs a region")
        out[name] = Egress(name, region, proxy)
    return out


def parse_profiles(raw: Mapping[str, Any], egress: Mapping[str, Egress]) -> dict[str, Profile]:
    """Profile tables by name, each checked: honest User-Agent, known egresses of its region."""
    out: dict[str, Profile] = {}
    for name, spec in raw.items():
        where = f"profiles[{name!r}]"
        _check_table(where, name, spec, _PROFILE_KEYS,
                     "a table (user_agent, region, egress, ...)")
        ua = str(spec.get("user_agent") or "")
        problem = user_agent_problem(ua)
        if problem:
            raise ConfigError(f"{where}: user_agent {problem}")
        region = str(spec.get("region") or "")
        if not region:
            raise ConfigError(f"{where}: needs a region (each egress it uses must be in it)")
        pool = tuple(str(e) for e in (spec.get("egress") or [DIRECT]))
        for e in pool:
            if e not in egress:
                raise ConfigError(f"{where}: unknown egress {e!r} (known: "
                                  f"{', '.join(sorted(egress))})")
            if egress[e].region != region:
                raise ConfigError(f"{where}: region {region!r} cannot use egress {e!r} of "
                                  f"region {egress[e].region!r}: a profile never leaves its "
                                  "region")
        if len(set(pool)) != len(pool):
            raise ConfigError(f"{where}: egress lists {pool} with a repeat")
        headers = spec.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise ConfigError(f"{where}: headers must be a table of name = value")
        bad = sorted(h for h in headers if str(h).lower() in RESERVED_HEADERS)
        if bad:
            raise ConfigError(f"{where}: headers may not set {bad} (the User-Agent is "
                              "user_agent; Host and Cookie belong to the request)")
        token = str(spec.get("robots_token") or product_token(ua))
        if not _TOKEN_RE.fullmatch(token):
            raise ConfigError(f"{where}: robots_token {token!r} is not a product token")
        out[name] = Profile(
            name=name, user_agent=ua, robots_token=token, region=region, egress=pool,
            headers=tuple((str(k), str(v)) for k, v in headers.items()),
            cookies=bool(spec.get("cookies", False)),
            bundle_version=str(spec.get("bundle_version") or "1"),
            targets=tuple(str(t) for t in (spec.get("targets") or ())),
            follow_sitemaps=_flag(where, spec, "follow_sitemaps"))
    return out


def _flag(where: str, spec: Mapping[str, Any], key: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false")
    return value


def tables_of(value: Any, setting: str) -> dict[str, Any]:
    """A TOML table of tables, or its JSON text (the ``CRAWLFLEET_PROFILES`` form)."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"setting {setting!r}: expected TOML tables or a JSON object "
                              f"({exc})") from exc
    if not isinstance(value, Mapping):
        raise ConfigError(f"setting {setting!r}: expected tables by name")
    return dict(value)


class UnknownProfileError(FatalError):
    """A job names a profile this worker's configuration does not know: it cannot be sent
    as an identity nobody defined here, and trying again on this worker cannot help."""

    reason = "unknown_profile"


def unknown_profile(name: str, known: Mapping[str, Profile]) -> UnknownProfileError | None:
    """The error of a job naming ``name``, or None when ``known`` has it."""
    if name in known:
        return None
    return UnknownProfileError(
        f"profile {name[:64]!r} is not configured on this worker (known: "
        f"{', '.join(sorted(known))}); add it to [profiles] and replay the dead letter")


PROFILE_COLUMNS = ("profile", "user_agent", "robots_token", "region", "egress", "cookies",
                   "bundle", "targets", "headers")
EGRESS_COLUMNS = ("egress", "region", "proxy", "used_by")


def profile_rows(profiles: Mapping[str, Profile],
                 egress: Mapping[str, Egress]) -> list[tuple[str, ...]]:
    """``crawlfleet profiles``' rows: each profile with its egress pool (each egress with its
    region and its proxy URL, password redacted). Header values are left out: a header may
    carry a token, and its name is what an operator checks."""
    rows: list[tuple[str, ...]] = []
    for p in sorted(profiles.values(), key=lambda p: p.name):
        pool = ", ".join(f"{e} ({egress[e].region}: {egress[e].shown})" if e in egress
                         else f"{e} (unknown)" for e in p.egress)
        rows.append((p.name, p.user_agent, p.robots_token, p.region, pool,
                     "on" if p.cookies else "off", p.bundle_version,
                     ", ".join(p.targets) or "all", ", ".join(k for k, _ in p.headers)))
    return rows


def egress_rows(profiles: Mapping[str, Profile],
                egress: Mapping[str, Egress]) -> list[tuple[str, ...]]:
    """Every egress (``direct`` included): its region, redacted proxy and the profiles using
    it."""
    return [(e.name, e.region, e.shown,
             ", ".join(sorted(p.name for p in profiles.values() if e.name in p.egress)) or "-")
            for e in sorted(egress.values(), key=lambda e: e.name)]
