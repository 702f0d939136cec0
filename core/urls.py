"""URL canonicalisation, target derivation and address safety: pure functions.

Canonical form is what dedupe keys and partitioning are derived from, so it must be
stable: lower-case scheme and host, IDNA host, no default port, no fragment, sorted query
(w3lib), and ``/`` for an empty path.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urljoin, urlsplit, urlunsplit

import ada_url
from publicsuffixlist import PublicSuffixList
from w3lib.url import canonicalize_url

from core.errors import ForbiddenAddressError, InvalidURLError

ALLOWED_SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL_LENGTH = 4096


def canonicalize(url: str) -> str:
    """Return the canonical form of an absolute http(s) URL, or raise InvalidURLError.

    Pure, so memoised: a crawl meets the same link on many pages (site navigation), and
    w3lib's canonicalisation is the parse stage's largest cost. Only URLs up to
    ``_CACHED_URL_LENGTH`` are cached, which bounds the cache's memory (~30 MB).
    """
    url = url.strip()
    plain = _plain_canonical(url)
    if plain is not None:
        return plain
    return _canonicalize_cached(url) if len(url) <= _CACHED_URL_LENGTH else _canonicalize(url)


_CACHED_URL_LENGTH = 256

# URLs whose canonical form is known without w3lib: lower-case http(s) scheme and ASCII host
# (LDH labels), a non-default port, a path of unreserved characters only (no params,
# userinfo, escapes or dot segments), no fragment, and a query (if any) of ``key=value`` pairs
# of unreserved characters. Most links and seeds of a crawl look like this; w3lib takes
# ~20 us on a plain one and ~45 us on one with a query, to return it as it is or with its
# pairs sorted.
_UNRESERVED = r"[A-Za-z0-9._~-]"
_PAIR = rf"{_UNRESERVED}+={_UNRESERVED}*"
_PLAIN_URL = re.compile(
    r"(https?)://((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)"
    rf"(?::([1-9][0-9]{{0,4}}))?(/[A-Za-z0-9._~/-]*)(?:\?({_PAIR}(?:&{_PAIR})*))?")


def _plain_canonical(url: str) -> str | None:
    """The canonical form of a URL of :data:`_PLAIN_URL`'s shape, without w3lib (None for any
    other URL). Its query's pairs are sorted by key, then value, as w3lib sorts them; being
    unreserved characters, none is re-encoded."""
    m = _PLAIN_URL.fullmatch(url)
    if m is None or len(url) > MAX_URL_LENGTH or "xn--" in m[2] or len(m[2]) > 253 \
            or "/." in m[4]:  # dot segments are resolved by w3lib
        return None
    if ends_in_number(m[2]) and not is_ip(m[2]):  # 2130706433, 127.1: an address, spelt
        return None
    port = m[3]
    if port is not None and (int(port) > 65535 or int(port) == DEFAULT_PORTS[m[1]]):
        return None
    query = m[5]
    if query is None or "&" not in query:
        return url
    pairs = [tuple(pair.split("=", 1)) for pair in query.split("&")]
    ordered = sorted(pairs)
    if ordered == pairs:
        return url
    return f"{url[:m.start(5)]}{'&'.join(f'{k}={v}' for k, v in ordered)}"


def _already_canonical(url: str) -> bool:
    """Whether ``url`` is its own canonical form by the fast path alone."""
    return _plain_canonical(url) == url


def _canonicalize(url: str) -> str:
    if not url:
        raise InvalidURLError("empty URL")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURLError(f"URL longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ALLOWED_SCHEMES:
            raise InvalidURLError(f"unsupported scheme {parts.scheme!r} in {url!r}")
        host = parts.hostname
        if not host:
            raise InvalidURLError(f"no host in {url!r}")
        port = parts.port
    except ValueError as exc:  # bad port, bad IPv6 literal
        raise InvalidURLError(f"malformed URL {url!r}: {exc}") from exc
    if "%" in host:  # an IPv6 zone id (fe80::1%eth0): an interface, not a host on the web
        raise InvalidURLError(f"zone identifier in the host of {url!r}")
    try:
        host = host.encode("idna").decode("ascii").lower() if not is_ip(host) else host
    except UnicodeError as exc:
        raise InvalidURLError(f"bad host name in {url!r}") from exc
    # After IDNA's mapping: "¹" and fullwidth digits become ASCII digits there, so a host
    # spelt with them is a number too (and its canonical form a fixed point).
    if not is_ip(host) and ends_in_number(host):
        host = _whatwg_ipv4(host, url)
    if not is_ip(host) and not _FORBIDDEN_HOST_CHARS.isdisjoint(host):
        # w3lib would rewrite them (a backslash becomes a slash, moving the host into the
        # path), so the result would not be canonical, or not the same host.
        raise InvalidURLError(f"forbidden character in host name of {url!r}")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    rebuilt = urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
    canonical = canonicalize_url(rebuilt, keep_fragments=False)
    if len(canonical) > MAX_URL_LENGTH:  # percent-encoding made it longer than it was
        raise InvalidURLError(f"URL longer than {MAX_URL_LENGTH} characters once encoded")
    return canonical


_canonicalize_cached = lru_cache(maxsize=1 << 16)(_canonicalize)

_NUMBER_LABEL = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")


def ends_in_number(host: str) -> bool:
    """WHATWG's "ends in a number": the host's last label (a trailing dot dropped) is
    digits or ``0x`` hex, so a browser reads the whole host as an IPv4 address."""
    labels = host.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()
    return bool(_NUMBER_LABEL.fullmatch(labels[-1]))


def _whatwg_ipv4(host: str, url: str) -> str:
    """The dotted quad a browser connects to for ``host`` (``2130706433``, ``127.1``,
    ``0177.0.0.1``, ``127.000.000.001``, ``127.0.0.1.``, ``0x7f.1`` are all 127.0.0.1), by the
    WHATWG host parser (ada): one spelling, so one dedupe key, target and policy decision."""
    try:
        parsed = ada_url.URL(f"http://{host}/").hostname
    except ValueError as exc:
        raise InvalidURLError(f"host of {url!r} ends in a number but is no IPv4 address"
                              ) from exc
    if not is_ip(parsed):  # never: the parser returns an address or fails
        raise InvalidURLError(f"host of {url!r} is not an IPv4 address: {parsed!r}")
    return str(parsed)

#: WHATWG's forbidden domain code points (C0 controls, space, ``#%/:<>?@[\\]^|``, DEL).
_FORBIDDEN_HOST_CHARS = frozenset(chr(c) for c in range(0x21)) | frozenset("#%/:<>?@[\\]^|\x7f")


@lru_cache(maxsize=4096)
def is_ip(host: str) -> bool:
    """Whether ``host`` is an IP literal (v4 or v6)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


#: ``scheme://host[:port]`` of a canonical URL whose host is a plain lower-case name or
#: IPv4 address: the host is then what ``urlsplit`` would say, without its cost.
_PLAIN_NETLOC = re.compile(r"https?://([a-z0-9.-]+)(?::[0-9]+)?(?=[/?#]|$)")


def host_of(url: str) -> str:
    """Lower-case host (no port) of a canonical URL."""
    m = _PLAIN_NETLOC.match(url)
    if m is not None:
        return m[1]
    return urlsplit(url).hostname or ""


def origin_of(url: str) -> str:
    """``scheme://netloc`` of an absolute URL, without parsing it (the URL if it has no path)."""
    start = url.find("//")
    slash = url.find("/", start + 2) if start >= 0 else -1
    return url if slash < 0 else url[:slash]


def target_of(url: str, mode: str = "host") -> str:
    """The politeness unit of a canonical URL: its host, or its registrable domain.

    ``domain`` mode takes the registrable domain from the Public Suffix List (its private
    section included: ``a.github.io`` and ``b.github.io`` are two sites); IP hosts, and hosts
    that are a public suffix themselves (``localhost``, ``co.uk``), stay whole.
    """
    # "example.com." and "example.com" are one site (nightly fuzz): one target, one cap.
    return _target_of_host(host_of(url).rstrip("."), mode)


@lru_cache(maxsize=1 << 16)
def _target_of_host(host: str, mode: str) -> str:
    """Memoised by host: a crawl has far fewer hosts than URLs."""
    if mode == "host" or is_ip(host):
        return host
    return registrable_domain(host)


@lru_cache(maxsize=1)
def _suffixes() -> PublicSuffixList:
    return PublicSuffixList()  # the snapshot bundled with the pinned package: no download


def registrable_domain(host: str) -> str:
    """``host``'s registrable domain by the Public Suffix List (the host if it has none)."""
    return _suffixes().privatesuffix(host.rstrip(".")) or host






def resolve_link(base: str, href: str) -> str | None:
    """Absolute canonical URL of ``href`` found on ``base``, or None if not crawlable.

    Site-absolute (``/path``) and absolute (``http://...``) hrefs resolve the same way on
    every page of an origin, so those are memoised by (origin, href); a page's navigation
    links then cost one cache lookup each.
    """
    href = href.strip()
    if not href or href.startswith(("#", "javascript:", "mailto:", "tel:", "data:")):
        return None
    if len(href) <= _CACHED_URL_LENGTH:
        if href[0] == "/" and href[1:2] != "/":
            origin = origin_of(base)
            if origin != base:
                return _resolve_on_origin(origin, href)
        elif href.startswith(("http://", "https://")):
            return _resolve_on_origin("", href)
    return _resolve(base, href)


def _resolve(base: str, href: str) -> str | None:
    try:
        return canonicalize(urljoin(base, href))
    except (InvalidURLError, ValueError):  # urljoin raises ValueError on a bad IPv6 literal
        return None


@lru_cache(maxsize=1 << 16)
def _resolve_on_origin(origin: str, href: str) -> str | None:
    """``href`` (absolute, or a path) on ``origin`` ("" for absolute), memoised."""
    joined = origin + href  # what urljoin gives for a plain path or an absolute URL
    plain = _plain_canonical(joined)
    return plain if plain is not None else _resolve(origin, href)


#: NAT64 (RFC 6052): the last 32 bits are the IPv4 address the gateway connects to.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
_IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


def _embedded_ipv4(addr: _IPAddr) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address also reaches: IPv4-mapped, NAT64, 6to4, Teredo."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return []
    out = [a for a in (addr.ipv4_mapped, addr.sixtofour) if a is not None]
    if addr in _NAT64:
        out.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    if addr.teredo is not None:
        out.append(addr.teredo[1])
    return out


def _public(addr: _IPAddr) -> bool:
    # fec0::/10 (site-local, deprecated but routed inside sites) is what Python calls global.
    site_local = isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local
    return addr.is_global and not (addr.is_private or addr.is_loopback or addr.is_link_local
                                   or addr.is_multicast or addr.is_reserved
                                   or addr.is_unspecified or site_local)


def address_is_public(ip: str) -> bool:
    """True if ``ip`` and every IPv4 address embedded in it are public unicast addresses.

    IPv4-mapped and NAT64 addresses are judged by their IPv4 address alone; 6to4 forms of
    loopback or private addresses (``64:ff9b::7f00:1``, ``2002:7f00:1::``) are not public.
    """
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return _public(addr.ipv4_mapped)
        if addr in _NAT64:  # Python's is_global varies by version for this prefix
            return _public(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    return _public(addr) and all(_public(a) for a in _embedded_ipv4(addr))


@dataclass(frozen=True)
class AddressPolicy:
    """Which resolved addresses a crawler may connect to (SSRF guard), applied where the
    connection is made. Public addresses always; others only if allowed by ``allow_hosts``
    (host names, IP addresses or CIDR networks) or, all at once, by ``allow_private``."""

    allow_private: bool = False
    hosts: frozenset[str] = frozenset()
    networks: tuple[_IPNet, ...] = ()

    @classmethod
    def of(cls, allow_private: bool, allow_hosts: tuple[str, ...] = ()) -> AddressPolicy:
        hosts: set[str] = set()
        networks: list[_IPNet] = []
        for entry in allow_hosts:
            net = parse_network(entry)
            if net is not None:
                networks.append(net)
            else:
                hosts.add(entry.strip().rstrip(".").lower())
        return cls(allow_private, frozenset(hosts), tuple(networks))

    def allows(self, host: str, ip: str) -> bool:
        if self.allow_private or host.rstrip(".").lower() in self.hosts:
            return True
        try:
            if address_is_public(ip):
                return True
            addr = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            return False
        reached = [addr, *_embedded_ipv4(addr)]
        return any(a.version == n.version and a in n for a in reached for n in self.networks)

    def check(self, host: str, ip: str) -> None:
        """Raise :class:`ForbiddenAddressError` (with the setting that would allow it)."""
        if not self.allows(host, ip):
            raise ForbiddenAddressError(refusal_message(host, ip))


def refusal_message(host: str, ip: str) -> str:
    shown = f"{host} ({ip})" if host != ip else ip
    return (f"address of {shown} is not public (private, loopback, link-local or reserved); "
            f"allow it with --allow-hosts {host} (setting allow_hosts) or --allow-private")


def parse_network(entry: str) -> _IPNet | None:
    """An IP address or CIDR network from an ``allow_hosts`` entry, None for a host name."""
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return None


def check_address(ip: str, allow_private: bool) -> None:
    """Refuse addresses a public crawler must never reach (SSRF guard)."""
    AddressPolicy(allow_private).check(ip, ip)
