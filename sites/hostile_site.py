"""A deliberately hostile loopback site: every trap a crawler must survive, with counters.

A raw asyncio server (not a web framework: most traps are bytes no framework would send)
on several 127.0.0.x hosts of one port. The main host serves an index that links to every
trap and to good pages; the *off-scope* host must never be asked anything (links and
redirects point there), and the *refused* host sits outside the address policy. Each
trap's expected outcome is declared beside it (:func:`traps`), so a test can referee the
crawl trap by trap and the notes can list them. Traps that are not one page declare theirs
in a comment beside them:

- :data:`REFUSED_SPELLINGS`: the refused host spelt as a browser would read it (decimal,
  short, octal, hex, zero-padded, trailing dot): each link is one job under its canonical
  URL, dead-lettered ``address_not_allowed``; the refused host is never asked anything.
  :data:`MAIN_SPELLING` spells the main host: the same dedupe key as ``/good/1``, fetched once.
- ``/up/0`` ... ``/up/8``: every link answers 301 to its trailing-slash form, as an
  http → https redirect would (this site has no TLS): hops count per chain, so each
  ``/up/N`` is recorded 301 and each ``/up/N/`` stored 200, past ``max_redirects``.
- :func:`metadata_traps` (crawled with scope ``any``, not linked from the index): a link and
  a 302 to 169.254.169.254; the links' jobs are dead-lettered ``address_not_allowed``.
- The *robots-redirect* host: its robots.txt answers 302 to 169.254.169.254. The origin is
  allowed but its robots.txt cannot be fetched, so it is unreachable (RFC 9309 §2.3.1.4):
  its jobs end ``robots_unreachable``, never fetched (:data:`ROBOTS_REDIRECT_EXPECT`).
- ``/mint/K`` pages link 1,000 hosts each in 127.1.0.0/16 (:meth:`HostileSite.minted`),
  where nothing listens: wildcard DNS without any DNS, every connection refused on the
  loopback interface. A fetch worker's state for them stays within ``max_target_state``.

Loopback only: every host and every address a trap sends a crawler to is in 127.0.0.0/8,
except 169.254.169.254, which the address policy refuses (and the tests' connect audit
would refuse too, were the policy broken).
"""

from __future__ import annotations

import asyncio
import collections
import gzip
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Writer = asyncio.StreamWriter
MB = 1024 * 1024


@dataclass(frozen=True)
class Trap:
    what: str
    #: "stored" (a page, harmless), "redirect*" (a recorded 3xx and that telemetry reason)
    #: or the reason the job is dead-lettered with.
    expect: str
    run: Callable[[HostileSite, Writer], Awaitable[None]]
    #: Served on a host of its own: a trap that times out or fails retryably slows its
    #: target (adaptive back-off), and should not slow every other trap with it.
    own_host: bool = False


def _head(status: str = "200 OK", ctype: str = "text/html", extra: str = "",
          length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {ctype}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _page(body: bytes, ctype: str = "text/html", status: str = "200 OK",
          extra: str = "") -> Callable[[HostileSite, Writer], Awaitable[None]]:
    async def run(site: HostileSite, w: Writer) -> None:
        w.write(_head(status, ctype, extra, len(body)) + body)
    return run


def _raw(data: bytes, hold_s: float = 0.0) -> Callable[[HostileSite, Writer], Awaitable[None]]:
    async def run(site: HostileSite, w: Writer) -> None:
        w.write(data)
        await w.drain()
        if hold_s:
            await asyncio.sleep(hold_s)
    return run


def _redirect(location: str, status: str = "302 Found"
              ) -> Callable[[HostileSite, Writer], Awaitable[None]]:
    async def run(site: HostileSite, w: Writer) -> None:
        to = location.format(off=site.off_base, offhost=f"{site.off_scope}:{site.port}")
        w.write(_head(status, extra=f"Location: {to}", length=0))
    return run


async def _huge(site: HostileSite, w: Writer) -> None:
    """Declares 200 MB and sends it as long as anyone reads."""
    w.write(_head(length=200 * MB))
    for _ in range(200 * 16):
        w.write(b"x" * 65536)
        await w.drain()


async def _endless_chunked(site: HostileSite, w: Writer) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(200 * 16):  # 200 MB, chunk by chunk, no end in sight
        w.write(b"10000\r\n" + b"y" * 65536 + b"\r\n")
        await w.drain()


async def _drip(site: HostileSite, w: Writer) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(600):
        w.write(b"1\r\n.\r\n")
        await w.drain()
        await asyncio.sleep(0.2)


async def _silent(site: HostileSite, w: Writer) -> None:
    await asyncio.sleep(60)  # reads the request, never answers


def _bomb() -> bytes:
    data = gzip.compress(b"\0" * (64 * MB), compresslevel=9)  # ~64 KB on the wire
    return _head(extra="Content-Encoding: gzip", length=len(data)) + data


_BINARY = bytes(range(256)) * 64
#: A title that is console markup (rich): stored and printed as written, never rendered.
MARKUP_TITLE = "[/] [link=http://x.test]click[/link] [bold red]boom"
#: Where ``/location-bytes`` leads: its Location's byte 0xE9, percent-encoded as sent.
LOCATION_BYTES_TARGET = "/caf%E9"
#: Levels of the ``/up/`` section, each a 301 and a page: beyond max_redirects (5).
UP_LEVELS = 9
#: (spelling, path): the refused host 127.0.0.4 as the WHATWG URL parser reads it.
REFUSED_SPELLINGS = (("2130706436", "/n/dec"), ("127.4", "/n/short"),
                     ("0177.0.0.4", "/n/octal"), ("0x7f.0.0.4", "/n/hex"),
                     ("127.000.000.004", "/n/zeros"), ("127.0.0.4.", "/n/dot"))
#: The main host 127.0.0.2 spelt in hex: the same page (dedupe key) as ``/good/1``.
MAIN_SPELLING = ("0x7f.0.0.2", "/good/1")
#: How every job of the robots-redirect host ends (its page is never requested).
ROBOTS_REDIRECT_EXPECT = "robots_unreachable"
#: The cloud metadata address (link-local): never connected to.
METADATA = "http://169.254.169.254"
_INDEX_EXTRA = [
    "{off}/linked-off-scope", "//{offhost}/scheme-relative", "HTTP://{offhost}/upper-scheme",
    "ftp://{host}/file", "javascript:alert(1)", "mailto:a@b.test", "data:text/html,hi",
    "/private/secret",  # disallowed by robots.txt: never requested
]


def traps() -> dict[str, Trap]:
    t = {
        "/good/1": Trap("a good page", "stored", _page(b"<title>good 1</title><p>one")),
        "/good/2": Trap("a good page", "stored", _page(b"<title>good 2</title><p>two")),
        "/good/latin1": Trap("latin-1 declared in <meta>", "stored", _page(
            b"<meta charset='iso-8859-1'><title>caf\xe9</title>")),
        "/base-href": Trap("<base href> to the off-scope host", "stored", _base_href),
        "/charset-idna": Trap("Content-Type charset=idna (crashed parse)", "stored", _page(
            b"<title>idna</title><p>\xff\xfe", ctype="text/html; charset=idna")),
        "/charset-meta-rot13": Trap("<meta> charset=rot13", "stored", _page(
            b"<meta http-equiv='Content-Type' content='text/html; charset=rot13'><p>x")),
        "/charset-utf16-odd": Trap("UTF-16 BOM, odd length", "stored", _page(
            b"\xff\xfe<\x00p\x00>\x00x", ctype="text/html; charset=utf-16")),
        "/charset-bogus": Trap("unknown charset", "stored", _page(
            b"<p>caf\xe9", ctype="text/html; charset=x-no-such-thing")),
        "/binary-as-html": Trap("binary served as text/html", "stored", _page(_BINARY)),
        "/status-042": Trap("odd status line 042", "protocol_error",
                            _page(b"ok", status="042 Odd")),
        "/status-999": Trap("status 999", "protocol_error", _page(b"ok", status="999 Odd")),
        "/bomb": Trap("gzip bomb, 64 MB from ~64 KB", "decompression_bomb", _raw(_bomb())),
        "/huge": Trap("200 MB declared Content-Length", "too_large", _huge),
        "/huge-chunked": Trap("200 MB chunked, no length", "too_large", _endless_chunked),
        "/drip": Trap("one byte every 0.2 s", "timeout", _drip, own_host=True),
        "/silent": Trap("headers never come", "timeout", _silent, own_host=True),
        "/wrong-length": Trap("Content-Length 1000, 10 bytes sent", "truncated_body", _raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789"), own_host=True),
        "/chunk-cut": Trap("connection closed inside a chunk", "truncated_body", _raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\nhello"),
                          own_host=True),
        "/bad-chunk": Trap("invalid chunk size, connection held", "protocol_error", _raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n", 30)),
        "/header-flood": Trap("500 headers", "protocol_error", _raw(
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-F%d: y\r\n" % i for i in range(500))
            + b"Content-Length: 2\r\n\r\nok")),
        "/long-header": Trap("one 100 KB header line", "headers_too_large", _raw(
            b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n")),
        "/garbage-status": Trap("garbage status line", "protocol_error",
                                _raw(b"FOO BAR BAZ\r\n\r\nhello")),
        "/http09": Trap("HTTP/0.9 answer (no status line)", "protocol_error",
                        _raw(b"<html>no status line</html>")),
        "/two-lengths": Trap("conflicting Content-Length", "protocol_error", _raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nokxyz")),
        "/bad-gzip": Trap("Content-Encoding gzip, not gzip", "protocol_error", _raw(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\n"
            b"0123456789")),
        "/redirect-in": Trap("redirect inside the scope", "redirect", _redirect("/good/2")),
        "/redirect-off": Trap("redirect to the off-scope host", "redirect_out_of_scope",
                              _redirect("{off}/stolen")),
        "/redirect-off-relative": Trap("scheme-relative redirect off scope",
                                       "redirect_out_of_scope", _redirect("//{offhost}/x")),
        "/redirect-ftp": Trap("redirect to ftp:", "redirect_out_of_scope",
                              _redirect("ftp://127.0.0.1/x")),
        "/loop-a": Trap("redirect cycle a → b → a", "redirect", _redirect("/loop-b")),
        "/loop-b": Trap("redirect cycle b → a", "redirect", _redirect("/loop-a")),
        "/self": Trap("redirect to itself", "redirect_loop", _redirect("/self")),
        "/markup-title": Trap("a title that is console markup", "stored", _page(
            f"<title>{MARKUP_TITLE}</title><p>markup".encode())),
        "/header-bytes": Trap("a header value that is not UTF-8 (X-Note: caf\\xe9 \\xff)",
                              "stored", _raw(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Note: caf\xe9 \xff\r\n"
            b"Content-Length: 20\r\nConnection: close\r\n\r\n<title>bytes</title>")),
        "/ctype-bytes": Trap("a Content-Type that is not UTF-8", "stored", _raw(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=caf\xe9\r\n"
            b"Content-Length: 20\r\nConnection: close\r\n\r\n<title>ctype</title>")),
        # Its target, /caf%E9 (the byte as sent, percent-encoded), is stored.
        "/location-bytes": Trap("a Location that is not UTF-8 (/caf\\xe9)", "redirect", _raw(
            b"HTTP/1.1 302 Found\r\nLocation: /caf\xe9\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n")),
        # Every /up/N answers 301 to /up/N/, which links /up/N+1 (see _answer).
        "/up/0": Trap("a 301 on every link (http → https modelled by a trailing slash)",
                      "redirect", _redirect("/up/0/", "301 Moved Permanently")),
    }
    # An endless chain (/chain/0 → /chain/1 → ...): each hop is a job of its own, and the
    # one reached after max_redirects hops is recorded as redirect_loop, not followed.
    t["/chain/0"] = Trap("endless redirect chain", "redirect", _redirect("/chain/1"))
    return t


def metadata_traps() -> dict[str, Trap]:
    """Main-host pages of the scope ``any`` crawl, not linked from the index (with scope
    ``seeds`` they would only be out of scope). The link's job and the redirect's target
    (:data:`METADATA` URLs, outside the address policy) are dead-lettered
    ``address_not_allowed``: see :func:`metadata_outcomes`."""
    return {
        "/meta/link": Trap("a link to the cloud metadata address", "stored", _page(
            f"<title>meta</title><a href='{METADATA}/latest/meta-data/'>m</a>".encode())),
        "/meta/redirect": Trap("302 to the cloud metadata address", "redirect",
                               _redirect(f"{METADATA}/latest/meta-data/iam")),
    }


def metadata_outcomes() -> dict[str, str]:
    """Where :func:`metadata_traps` lead (canonical URLs) and how each of those jobs ends."""
    return {f"{METADATA}/latest/meta-data/": "address_not_allowed",
            f"{METADATA}/latest/meta-data/iam": "address_not_allowed"}


async def _base_href(site: HostileSite, w: Writer) -> None:
    body = (f"<base href='{site.off_base}/'><title>base</title>"
            "<a href='relative.html'>r</a>").encode()
    await _page(body)(site, w)


class HostileSite:
    """Serve ``traps()`` on ``main``; count every request by (host, path)."""

    def __init__(self, port: int, main: str = "127.0.0.2", off_scope: str = "127.0.0.3",
                 refused: str = "127.0.0.4",
                 own_hosts: tuple[str, ...] = ("127.0.0.5", "127.0.0.6", "127.0.0.7",
                                               "127.0.0.8"),
                 robots_redirect: str = "127.0.0.9", mint_pages: int = 12,
                 mint_per_page: int = 1000) -> None:
        self.port, self.main, self.off_scope, self.refused = port, main, off_scope, refused
        self.robots_redirect = robots_redirect
        self.mint_pages, self.mint_per_page = mint_pages, mint_per_page
        self.traps = traps()
        self.metadata = metadata_traps()
        own = [p for p, t in self.traps.items() if t.own_host]
        assert len(own) <= len(own_hosts), "one host per trap that has a host of its own"
        self.host_of = {p: own_hosts[i] if p in own else main
                        for i, p in enumerate(p for p in self.traps if p in own)}
        self.host_of.update({p: main for p in self.traps if p not in own})
        self._own = {h: p for p, h in self.host_of.items() if h != main}
        for h in (main, off_scope, refused, robots_redirect, *self._own):
            assert h.startswith("127."), "hostile traffic stays on loopback"
        assert mint_pages * mint_per_page <= 65535, "minted hosts fit in 127.1.0.0/16"
        self.hosts = (main, off_scope, refused, *self._own, robots_redirect)
        self.hits: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Every request as [started, ended, host, path], monotonic seconds: when its
        #: request line arrived and when the site was done with it (None: not yet).
        self.log: list[tuple[float, list[float], str, str]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hostile-site")
        self._ready = threading.Event()
        self._servers: list[asyncio.Server] = []

    @property
    def base(self) -> str:
        return f"http://{self.main}:{self.port}"

    @property
    def off_base(self) -> str:
        return f"http://{self.off_scope}:{self.port}"

    def url(self, path: str) -> str:
        """Where a trap is served (its own host, or the main one)."""
        return f"http://{self.host_of.get(path, self.main)}:{self.port}{path}"

    def seeds(self) -> list[str]:
        """The index, a page on the refused host, and each trap that has its own host
        (with scope ``seeds``, those hosts are in scope; the off-scope host is not)."""
        return [self.base + "/", f"http://{self.refused}:{self.port}/",
                *(self.url(p) for p in self._own.values())]

    def metadata_seeds(self) -> list[str]:
        """The scope ``any`` crawl: :func:`metadata_traps` and the robots-redirect host."""
        return [*(self.base + p for p in self.metadata), self.robots_redirect_page]

    @property
    def robots_redirect_page(self) -> str:
        return f"http://{self.robots_redirect}:{self.port}/page"

    def minted(self) -> list[str]:
        """Every minted host's URL (``http://127.1.X.Y:port/``), in the order linked."""
        return [f"http://127.1.{i // 256}.{i % 256}:{self.port}/"
                for i in range(1, 1 + self.mint_pages * self.mint_per_page)]

    def mint_seeds(self) -> list[str]:
        return [f"{self.base}/mint/{k}" for k in range(self.mint_pages)]

    def _mint_page(self, k: int) -> bytes:
        hosts = self.minted()[k * self.mint_per_page:(k + 1) * self.mint_per_page]
        return ("<title>mint</title>" + "".join(f"<a href='{u}'>h</a>" for u in hosts)
                ).encode()

    def robots_txt(self) -> bytes:
        """Over 500 KiB: a rule at the top, filler, and a "Disallow: /" past the cap."""
        head = b"User-agent: *\nDisallow: /private\n"
        return head + b"#" * (600 * 1024) + b"\nUser-agent: *\nDisallow: /\n"

    def index(self) -> bytes:
        links = [self.url(p) for p in self.traps] + ["/bad-links"] + [
            u.format(off=self.off_base, offhost=f"{self.off_scope}:{self.port}",
                     host=f"{self.main}:{self.port}") for u in _INDEX_EXTRA] + [
            f"http://{h}:{self.port}{p}" for h, p in (*REFUSED_SPELLINGS, MAIN_SPELLING)]
        body = "".join(f"<a href='{u}'>{u}</a>\n" for u in links)
        return f"<html><title>hostile</title><body>{body}</body></html>".encode()

    def timeline(self) -> list[tuple[float, float, str, str]]:
        """Every request so far, (started, ended, host, path), by start; one the site still
        holds (a silent trap's) ends now."""
        now = time.monotonic()
        with self._lock:
            return [(s, e[0] if e else now, h, p) for s, e, h, p in self.log]

    def requests(self, host: str | None = None) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter({p: n for (h, p), n in self.hits.items()
                                        if host in (None, h)})

    async def _handle(self, r: asyncio.StreamReader, w: Writer) -> None:
        ended: list[float] = []
        try:
            line = await r.readline()
            started = time.monotonic()
            while (await r.readline()) not in (b"\r\n", b""):
                pass
            parts = line.split()
            path = parts[1].decode("latin-1") if len(parts) > 1 else "/"
            host = str(w.get_extra_info("sockname")[0])
            with self._lock:
                self.hits[(host, path)] += 1
                self.log.append((started, ended, host, path))
            await self._answer(host, path, w)
            await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # the crawler hung up on a trap: that is the point
        except asyncio.CancelledError:
            pass  # the site stops while a trap holds a connection: nothing to report
        finally:
            w.close()
            ended.append(time.monotonic())

    async def _answer(self, host: str, path: str, w: Writer) -> None:
        if host in self._own and path != "/robots.txt":
            await self.traps[self._own[host]].run(self, w)
        elif host == self.robots_redirect:  # its page must never be asked for
            await (_redirect(f"{METADATA}/robots.txt") if path == "/robots.txt"
                   else _page(b"<title>never</title>"))(self, w)
        elif host != self.main:
            await _page(b"<p>no robots.txt here, or you should not be here",
                        status="404 Not Found")(self, w)
        elif path == "/robots.txt":
            await _page(self.robots_txt(), ctype="text/plain")(self, w)
        elif path == "/":
            await _page(self.index())(self, w)
        elif path == "/bad-links":
            await _page(b"<a href='http://[::1'>v6</a><a href='http://a.test:99999/'>p</a>"
                        b"<a href='\x00\x01'>c</a><a href='" + b"/a" * 5000 + b"'>long</a>")(
                            self, w)
        elif path in self.traps:
            await self.traps[path].run(self, w)
        elif path in self.metadata:
            await self.metadata[path].run(self, w)
        elif path == LOCATION_BYTES_TARGET:
            await _page(b"<title>cafe</title>")(self, w)
        elif path.startswith("/up/"):
            await self._up(path, w)
        elif path.startswith("/mint/") and path[6:].isdigit() \
                and int(path[6:]) < self.mint_pages:
            await _page(self._mint_page(int(path[6:])))(self, w)
        elif path.startswith("/chain/"):
            n = int(path.rsplit("/", 1)[1]) if path.rsplit("/", 1)[1].isdigit() else 0
            await _redirect(f"/chain/{n + 1}")(self, w)
        else:
            await _page(b"not found", status="404 Not Found")(self, w)

    async def _up(self, path: str, w: Writer) -> None:
        """``/up/N`` → 301 ``/up/N/``, which links ``/up/N+1`` (the last links nothing)."""
        level = path[4:].rstrip("/")
        if not level.isdigit() or int(level) >= UP_LEVELS:
            await _page(b"not found", status="404 Not Found")(self, w)
        elif not path.endswith("/"):
            await _redirect(f"/up/{level}/", "301 Moved Permanently")(self, w)
        else:
            n = int(level)
            link = f"<a href='/up/{n + 1}'>up</a>" if n + 1 < UP_LEVELS else ""
            await _page(f"<title>up {n}</title>{link}".encode())(self, w)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            for h in self.hosts:
                self._servers.append(await asyncio.start_server(self._handle, h, self.port))

        self._loop.run_until_complete(listen())
        self._ready.set()
        self._loop.run_forever()
        for srv in self._servers:
            srv.close()
        pending = asyncio.all_tasks(self._loop)  # traps still holding connections open
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def __enter__(self) -> HostileSite:
        self._thread.start()
        assert self._ready.wait(10), "hostile site did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
