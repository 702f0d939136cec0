"""The server of the local sites (:class:`DemoSite`): serves a ``SiteSpec`` on every host.

It runs its own event loop in a background thread, records every request (and the status it
answered) so tests can check politeness from the server's side, and can police per-host rate
caps. :func:`free_port` finds a port every host can bind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import html
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from types import TracebackType

from aiohttp import web

from sites.site_spec import SiteSpec

__all__ = ["RATE_SLACK_S", "DemoSite", "free_port", "with_crawl_delay"]

log = logging.getLogger(__name__)

#: how much shorter than 1 s the window of DemoSite's rate cap is (absorbs arrival jitter)
RATE_SLACK_S = 0.05

_HTML = "text/html; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"


def with_crawl_delay(robots: str, delay: float) -> str:
    """``robots`` with ``Crawl-delay: delay`` added to every user-agent group."""
    out: list[str] = []
    lines = robots.splitlines()
    for k, line in enumerate(lines):
        out.append(line)
        is_ua = line.strip().lower().startswith("user-agent:")
        next_is_ua = k + 1 < len(lines) and lines[k + 1].strip().lower().startswith("user-agent:")
        if is_ua and not next_is_ua:
            out.append(f"Crawl-delay: {delay:g}")
    return "\n".join(out) + "\n"


class DemoSite:
    """Serves a :class:`SiteSpec` on every ``host:port`` from a background thread.

    The server has its own event loop so it works under sync tests, async tests and the
    benchmark alike, and it records every request so tests can check politeness (robots obeyed,
    no URL fetched twice, per-host rates) from the server's side, where it cannot be faked.
    """

    def __init__(
        self,
        spec: SiteSpec,
        *,
        crawl_delay: float | None = None,
        rate_limit_log: bool = False,
        rate_cap: float | Mapping[str, float] | None = None,
        rate_enforce: bool = True,
        rate_slack_s: float = RATE_SLACK_S,
    ) -> None:
        """``rate_cap`` (requests/s, for every host or per host) makes the site police its
        visitors: a request that is more than the cap within the past ``1 - rate_slack_s``
        seconds (itself and every earlier request to the host counted, robots.txt and refused
        ones too) is a violation, and with ``rate_enforce`` it is answered 429 (Retry-After:
        1) instead of served. The slack absorbs arrival jitter, so a crawler that spaces its
        requests exactly ``1 / cap`` apart never trips it.
        """
        if not 0 <= rate_slack_s < 1:
            raise ValueError(f"rate_slack_s must be in [0, 1), got {rate_slack_s}")
        self.spec = spec
        self.crawl_delay = crawl_delay
        self.rate_limit_log = rate_limit_log
        caps = (
            dict.fromkeys(spec.hosts, float(rate_cap))
            if isinstance(rate_cap, int | float)
            else dict(rate_cap or {})
        )
        if any(c <= 0 for c in caps.values()):
            raise ValueError(f"rate caps must be > 0, got {caps}")
        #: host -> requests/s the site allows it (hosts not listed are uncapped)
        self.rate_caps: dict[str, float] = caps
        self.rate_enforce = rate_enforce
        self.rate_slack_s = rate_slack_s
        #: "http://host:port/path?query" as requested (query order kept) -> count
        self.requests: collections.Counter[str] = collections.Counter()
        #: (time.monotonic(), host, path?query) per request, in arrival order
        self.request_log: list[tuple[float, str, str]] = []
        #: the status answered to each request of ``request_log``, same order
        self.statuses: list[int] = []
        #: host -> requests over its rate cap (see ``rate_cap``)
        self.rate_violations: collections.Counter[str] = collections.Counter()
        #: host -> requests answered 429
        self.rate_limited: collections.Counter[str] = collections.Counter()
        # host -> arrival times within the cap's window; touched by the server thread only
        self._windows: dict[str, deque[float]] = {h: deque() for h in caps}
        self._transient: collections.Counter[str] = collections.Counter()
        # Guards requests/request_log so a test thread can snapshot them mid-crawl.
        self._lock = threading.Lock()
        self._robots: dict[str, bytes | None] = {}
        for h in spec.hosts:
            r = spec.robots_txt(h)
            if r is not None and crawl_delay is not None:
                r = with_crawl_delay(r, crawl_delay)
            self._robots[h] = None if r is None else r.encode()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.ServerRunner] = []
        self._rate_task: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind every host:port and return once all are listening (raises if one cannot)."""
        if self._thread is not None:
            raise RuntimeError("DemoSite already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:
                failure.append(exc)
                loop.run_until_complete(self._close())
                loop.close()
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="demo-site", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            self._loop = None
            raise failure[0]

    def stop(self) -> None:
        """Close all listeners and connections and end the server thread. Idempotent."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None
        self._loop = None

    def __enter__(self) -> DemoSite:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def _listen(self) -> None:
        for host in self.spec.hosts:
            server = web.Server(self._handler_for(host), access_log=None)
            runner = web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            self._runners.append(runner)
            await web.TCPSite(runner, host, self.spec.port, backlog=1024).start()
        if self.rate_limit_log:
            self._rate_task = asyncio.get_running_loop().create_task(self._log_rates())

    async def _close(self) -> None:
        if self._rate_task is not None:
            self._rate_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rate_task
            self._rate_task = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    # -- serving -------------------------------------------------------------------------------

    def _handler_for(
        self, host: str
    ) -> collections.abc.Callable[[web.BaseRequest], collections.abc.Awaitable[web.Response]]:
        prefix = f"http://{host}:{self.spec.port}"
        requests = self.requests
        request_log = self.request_log
        statuses = self.statuses
        lock = self._lock
        window = self._windows.get(host)
        cap = self.rate_caps.get(host, 0.0)
        span = 1.0 - self.rate_slack_s
        enforce = self.rate_enforce
        respond = self._responder(host)

        async def handle(request: web.BaseRequest) -> web.Response:
            # No await from arrival to the log entry: entries keep arrival order, and each
            # request's status lands beside it.
            raw = request.raw_path
            now = time.monotonic()
            over = False
            if window is not None:
                while window and window[0] <= now - span:
                    window.popleft()
                window.append(now)
                over = len(window) > cap
            if over and enforce:
                response = web.Response(
                    status=429,
                    body=b"<html><head><title>Slow down</title></head><body>429</body></html>",
                    headers={"Content-Type": _HTML, "Retry-After": "1"},
                )
            else:
                response = respond(raw)
            with lock:
                requests[prefix + raw] += 1
                request_log.append((now, host, raw))
                statuses.append(response.status)
                if over:
                    self.rate_violations[host] += 1
                if response.status == 429:
                    self.rate_limited[host] += 1
            return response

        return handle

    def _responder(self, host: str) -> collections.abc.Callable[[str], web.Response]:
        """What ``host`` answers to a request for ``raw`` (path?query), rate caps aside."""
        prefix = f"http://{host}:{self.spec.port}"
        spec = self.spec
        robots = self._robots[host]

        def respond(raw: str) -> web.Response:
            if raw.partition("?")[0] == "/robots.txt":
                if robots is None:
                    return web.Response(
                        status=404, body=b"no robots.txt here\n", headers={"Content-Type": _TEXT}
                    )
                return web.Response(body=robots, headers={"Content-Type": _TEXT})
            page = spec.page(host, raw)
            if page is None:
                return _not_found(raw)
            if page.transient_503s:
                key = prefix + page.path
                if self._transient[key] < page.transient_503s:
                    self._transient[key] += 1
                    headers = {"Content-Type": _HTML}
                    if spec.transient_retry_after is not None:
                        headers["Retry-After"] = spec.transient_retry_after
                    return web.Response(
                        status=503,
                        body=b"<html><head><title>Busy</title></head><body>try later</body></html>",
                        headers=headers,
                    )
            return web.Response(
                status=page.status, body=spec.body(page), headers={"Content-Type": _HTML}
            )

        return respond

    async def _log_rates(self) -> None:
        """Once a second, log each host's request count over the past second."""
        seen = 0
        while True:
            await asyncio.sleep(1.0)
            with self._lock:
                fresh = self.request_log[seen:]
            seen += len(fresh)
            per_host = collections.Counter(h for _, h, _ in fresh)
            for h in self.spec.hosts:
                if per_host[h]:
                    log.info("demo-site %s: %d req/s", h, per_host[h])

    # -- inspection ----------------------------------------------------------------------------

    def snapshot(self) -> tuple[collections.Counter[str], list[tuple[float, str, str]]]:
        """Consistent copies of ``requests`` and ``request_log``, safe while a crawl runs."""
        with self._lock:
            return collections.Counter(self.requests), list(self.request_log)

    def hits(self, host: str | None = None) -> int:
        """Requests received in total, or by ``host`` (robots.txt included)."""
        if host is None:
            return len(self.request_log)
        return sum(1 for _, h, _ in self.snapshot()[1] if h == host)

    def max_rate(self, host: str, window: float = 1.0) -> int:
        """Most requests ``host`` received within any ``window`` seconds: for politeness checks."""
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        times = [t for t, h, _ in self.snapshot()[1] if h == host]
        best, lo = 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] >= window:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    def log_with_statuses(self, start: int = 0) -> list[tuple[float, str, str, int]]:
        """``(time, host, path?query, status answered)`` per request from the ``start``-th on.

        Safe while a crawl runs; a watcher passes the count it has already seen.
        """
        with self._lock:
            return [
                (t, h, raw, status)
                for (t, h, raw), status in zip(
                    self.request_log[start:], self.statuses[start:], strict=True
                )
            ]

    def violations(self, host: str | None = None) -> int:
        """Requests over their host's rate cap, in total or for ``host``."""
        with self._lock:
            if host is None:
                return sum(self.rate_violations.values())
            return self.rate_violations[host]

    def reset(self) -> None:
        """Forget all requests, rate and transient-failure state, as a fresh server would."""
        with self._lock:
            self.requests.clear()
            self.request_log.clear()
            self.statuses.clear()
            self.rate_violations.clear()
            self.rate_limited.clear()
        if self._loop is not None and self._windows:
            # the windows belong to the server thread
            done = threading.Event()

            def clear() -> None:
                for w in self._windows.values():
                    w.clear()
                done.set()

            self._loop.call_soon_threadsafe(clear)
            done.wait(5)
        else:
            for w in self._windows.values():
                w.clear()
        self._transient.clear()


def _not_found(path: str) -> web.Response:
    body = (
        "<html><head><title>Not found</title></head>"
        f"<body>{html.escape(path)} is not here</body></html>"
    )
    return web.Response(status=404, body=body.encode(), headers={"Content-Type": _HTML})


def free_port(
    hosts: Iterable[str] = ("127.0.0.2", "127.0.0.3", "127.0.0.4"), start: int = 18080
) -> int:
    """First port >= ``start`` that every host can bind now, so parallel test runs don't clash.

    A fixed starting point keeps ports predictable in logs; probing avoids a hard-coded port
    that another process already holds.
    """
    hosts = tuple(hosts)
    for port in range(start, min(start + 2000, 65536)):
        socks: list[socket.socket] = []
        try:
            for h in hosts:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((h, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no free port in {start}..{start + 2000} on {hosts}")
