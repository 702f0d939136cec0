"""Header bytes that are not UTF-8 (a raw loopback server, a real :class:`Fetcher`): aiohttp
hands them over as lone surrogates, which no Avro or ClickHouse string can encode, so the
fetch stage failed the job as ``internal``. The Response carries valid text instead: a
Location with each such byte percent-encoded (the URL followed names the bytes sent), any
other value with U+FFFD; the fetch result record then encodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from consumers.fetch import http as http_fetch
from consumers.fetch.http import Fetcher, Response
from core.config import Settings
from core.urls import resolve_link
from schemas.codec import default_codec
from sites.demo_server import free_port

HOST = "127.0.0.2"
ANSWERS = {
    "/redirect": b"HTTP/1.1 302 Found\r\nLocation: /caf\xe9?q=\xff\r\nRetry-After: 5\xe9\r\n"
                 b"Content-Length: 0\r\nConnection: close\r\n\r\n",
    "/page": b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=caf\xe9\r\n"
             b"X-Note: caf\xe9 \xff\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
}


def _fetch_all(tmp_path: Path) -> dict[str, Response]:
    port = free_port((HOST,), 18750)
    got: dict[str, Response] = {}

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        line = await r.readline()
        while (await r.readline()) not in (b"\r\n", b""):
            pass
        w.write(ANSWERS[line.split()[1].decode()])
        await w.drain()
        w.close()

    async def main() -> None:
        srv = await asyncio.start_server(handle, HOST, port)
        settings = Settings(data_dir=tmp_path, allow_hosts=(HOST,), request_timeout_s=2.0)
        async with Fetcher(settings) as f:
            for path in ANSWERS:
                got[path] = await f.get(f"http://{HOST}:{port}{path}")
        srv.close()

    asyncio.run(main())
    return got


def _encode(resp: Response) -> None:
    job = {"url": resp.url, "profile": "default", "target": HOST, "depth": 0, "attempt": 0,
           "priority": 0, "parent_url": None, "last_error": None, "delay_ms": 0, "meta": {}}
    default_codec().encode("FetchResult", {
        "job": job, "final_url": resp.url, "status": resp.status,
        "content_type": resp.content_type, "body": resp.body, "fetched_at_ms": 0,
        "elapsed_ms": 0, "redirects": [resp.location or ""], "worker": "fetch-0"})


def test_header_bytes_that_are_not_utf8_become_valid_text(tmp_path: Path) -> None:
    got = _fetch_all(tmp_path)
    redirect, page = got["/redirect"], got["/page"]
    assert redirect.status == 302 and redirect.location == "/caf%E9?q=%FF"
    assert redirect.retry_after == "5\ufffd"
    assert resolve_link(redirect.url, redirect.location).endswith("/caf%E9?q=%FF")
    assert page.status == 200 and page.content_type == "text/html; charset=caf\ufffd"
    for resp in (redirect, page):
        _encode(resp)  # raised UnicodeEncodeError (surrogates not allowed) before


@pytest.mark.parametrize(("raw", "text", "location"), [
    ("/plain", "/plain", "/plain"),
    ("/caf\udce9", "/caf\ufffd", "/caf%E9"),
    ("/café", "/café", "/caf%C3%A9"),  # valid UTF-8 (aiohttp decodes it as such)
])
def test_header_text_and_location_text(raw: str, text: str, location: str) -> None:
    assert http_fetch.header_text(raw) == text
    assert http_fetch.location_text(raw) == location
