"""The dashboard's pure parts: parameters, the token and origin guard, the view→panel
mapping, one refresh's payload (on a fake query function), and the server's answers
(aiohttp's test client on loopback; no store, no browser)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from crawlfleet.dashboard import guard
from crawlfleet.dashboard.approvals import ApprovedSet
from crawlfleet.dashboard.data import SPAN_SQL, capped, window_data
from crawlfleet.dashboard.panels import PANELS, check_shape, missing, panels
from crawlfleet.dashboard.params import (
    EMPTY_SPAN_S,
    SPAN_MARGIN_S,
    DataRequest,
    ParamError,
    parse_request,
    window_seconds,
)
from crawlfleet.dashboard.server import STATIC, Dashboard
from infra.views import load_views

ROOT = Path(__file__).resolve().parents[2]
NAMES = [p.name for p in PANELS]


# --- parameters ------------------------------------------------------------------------------


def test_a_request_names_a_window_and_panels() -> None:
    assert parse_request([], NAMES) == DataRequest("1h", tuple(NAMES))
    got = parse_request([("window", "15m"), ("panel", "good_pages"), ("panel", "good_pages"),
                         ("panel", "target_health")], NAMES)
    assert got == DataRequest("15m", ("good_pages", "target_health"))
    assert parse_request([("window", "all")], NAMES).window == "all"


@pytest.mark.parametrize(("pairs", "why"), [
    ([("window", "5m")], "window must be one of 15m, 1h, 24h, all"),
    ([("window", "1h"), ("window", "24h")], "give one window"),
    ([("sql", "SELECT 1")], "unknown parameter"),
    ([("window", "1h"), ("q", "x")], "unknown parameter"),
    ([("panel", "pages_v")], "no panel 'pages_v'"),
    ([("panel", "good_pages; DROP TABLE pages")], "no panel"),
])
def test_anything_else_is_refused(pairs: list[tuple[str, str]], why: str) -> None:
    with pytest.raises(ParamError, match=why):
        parse_request(pairs, NAMES)


def test_window_lengths() -> None:
    assert window_seconds("15m", None) == 900 and window_seconds("24h", 5.0) == 86400
    assert window_seconds("all", None) == EMPTY_SPAN_S  # an empty store
    assert window_seconds("all", 7200.4) == 7200 + SPAN_MARGIN_S


# --- guard -----------------------------------------------------------------------------------

TOKEN, PORT = "t0ken", 8765
OWN = {"Host": f"127.0.0.1:{PORT}"}
COOKIE = {guard.cookie_name(PORT): TOKEN}


def test_the_token_comes_from_the_cookie_or_the_first_url() -> None:
    assert guard.refusal(OWN, COOKIE, {}, TOKEN, PORT) == ""
    assert guard.refusal(OWN, {}, {"token": TOKEN}, TOKEN, PORT) == ""
    assert "no valid token" in guard.refusal(OWN, {}, {}, TOKEN, PORT)
    assert "no valid token" in guard.refusal(OWN, {guard.cookie_name(PORT): "x"}, {}, TOKEN,
                                             PORT)
    # Another port's cookie is another dashboard's.
    assert "no valid token" in guard.refusal(OWN, {guard.cookie_name(1): TOKEN}, {}, TOKEN,
                                             PORT)
    assert len(guard.new_token()) >= 40 and guard.new_token() != guard.new_token()


def test_the_cookie_is_http_only_and_same_site_strict() -> None:
    header = guard.cookie_header(PORT, TOKEN)
    assert header.startswith(f"crawlfleet_dashboard_{PORT}={TOKEN};")
    assert "HttpOnly" in header and "SameSite=Strict" in header


@pytest.mark.parametrize(("headers", "why"), [
    ({"Host": "evil.example:8765"}, "127.0.0.1 only"),  # a DNS-rebound name
    ({"Host": "10.0.0.5:8765"}, "127.0.0.1 only"),
    ({**OWN, "Origin": "http://evil.example"}, "another origin"),
    ({**OWN, "Origin": "null"}, "another origin"),
    ({**OWN, "Origin": "http://127.0.0.1:9999"}, "another origin"),
    ({**OWN, "Referer": "http://evil.example/page"}, "referred by another origin"),
    ({**OWN, "Sec-Fetch-Site": "cross-site"}, "cross-site"),
    ({**OWN, "Sec-Fetch-Site": "same-site"}, "same-site"),
])
def test_other_origins_are_refused_even_with_the_token(headers: dict[str, str],
                                                       why: str) -> None:
    assert why in guard.refusal(headers, COOKIE, {}, TOKEN, PORT)


@pytest.mark.parametrize("host", ["127.0.0.1:8765", "localhost:8765", "[::1]:8765",
                                  "localhost:9000"])
def test_loopback_names_and_same_origin_pass(host: str) -> None:
    headers = {"Host": host, "Origin": f"http://{host}", "Referer": f"http://{host}/",
               "Sec-Fetch-Site": "same-origin"}
    assert guard.refusal(headers, COOKIE, {}, TOKEN, PORT) == ""


# --- panels ----------------------------------------------------------------------------------


def test_every_view_is_a_panel_and_every_panel_a_view() -> None:
    views = load_views()
    assert missing(views) == (set(), set())
    assert len(NAMES) == len(set(NAMES))
    for name, (panel, view) in panels(views).items():
        assert panel.title == view.title and panel.empty, name
        assert check_shape(panel, view) == [], name


def test_the_panels_the_issue_names_are_there() -> None:
    kinds = {p.name: p.kind for p in PANELS}
    assert {k: kinds[k] for k in ("queue_depth", "throughput", "good_pages",
                                  "oldest_task_age", "dead_by_reason")} == dict.fromkeys(
        ("queue_depth", "throughput", "good_pages", "oldest_task_age", "dead_by_reason"),
        "series")
    assert {"target_health", "slow_targets", "worker_success", "version_success",
            "quarantine_list"} <= {n for n, k in kinds.items() if k == "table"}
    version = next(p for p in PANELS if p.name == "version_success")
    assert version.approval and version.lead[:2] == ("share_of_requests", "share_of_failures")
    sampled = [p for p in PANELS if p.name in ("queue_depth", "throughput", "oldest_task_age")]
    assert all("needs one sample interval" in p.empty for p in sampled)


def test_a_panel_that_does_not_fit_its_view_is_caught() -> None:
    views = load_views()
    table_as_series = next(p for p in PANELS if p.name == "target_health")
    bad = type(table_as_series)(**{**table_as_series.describe(), "kind": "series",
                                   "highlight": ("no_such_column",)})
    errors = check_shape(bad, views["target_health"])
    assert any("not bucketed by time" in e for e in errors)
    assert any("no column no_such_column" in e for e in errors)


def test_static_files_ship_with_the_package() -> None:
    shipped = {p.name for p in STATIC.iterdir()}
    assert {"index.html", "dashboard.js", "dashboard.css", "uPlot.iife.min.js",
            "uPlot.min.css", "uPlot.LICENSE"} <= shipped
    assert "MIT License" in (STATIC / "uPlot.LICENSE").read_text()
    text = (ROOT / "pyproject.toml").read_text()
    assert '"crawlfleet.dashboard" = ["static/*"]' in text
    # Nothing from the network: no absolute URL in what the page loads.
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        body = (STATIC / name).read_text()
        assert "http://" not in body and "https://" not in body and "//cdn" not in body, name


# --- one refresh -----------------------------------------------------------------------------


class FakeStore:
    """Answers the span query and every view with canned rows; records what it ran."""

    def __init__(self, rows: dict[str, list[list[Any]]], age: float = -1) -> None:
        self.rows, self.age, self.ran = rows, age, []

    def __call__(self, sql: str) -> tuple[list[str], list[list[Any]]]:
        self.ran.append(sql)
        if sql == SPAN_SQL:
            return ["age"], [[self.age]]
        for marker, rows in self.rows.items():
            if marker in sql:
                return ["c"], rows
        return ["c"], []


def test_one_window_for_every_panel_and_empty_panels_say_why() -> None:
    store = FakeStore({"FROM fetch_events": [[1], [2], [3]]}, age=120)
    got = window_data(DataRequest("all", tuple(NAMES)), panels(), store, max_rows=2)
    assert got["since_s"] == 120 + SPAN_MARGIN_S and got["bucket_s"] == 10
    assert store.ran[0] == SPAN_SQL and len(store.ran) == 1 + len(NAMES)
    assert all("$__" not in sql and "LIMIT 3" in sql for sql in store.ran[1:])
    health = got["panels"]["target_health"]
    assert health["rows"] == [[1], [2]] and health["truncated"] and health["empty"] is None
    assert "needs one sample interval" in got["panels"]["queue_depth"]["empty"]
    assert got["store_error"] is None


def test_a_store_that_does_not_exist_is_said_once() -> None:
    from core.errors import ConfigError

    def query(sql: str) -> tuple[list[str], list[list[Any]]]:
        raise ConfigError("no crawl store at /x/clickhouse: run a crawl first")

    got = window_data(DataRequest("1h", tuple(NAMES)), panels(), query)
    assert got["store_error"].startswith("no crawl store") and got["panels"] == {}


def test_an_engine_error_is_the_panels_and_a_held_store_the_pages() -> None:
    from core.errors import QueryError
    from infra.clickhouse import StoreHeldError

    def query(sql: str) -> tuple[list[str], list[list[Any]]]:
        if "fetch_events" in sql:
            raise QueryError("Unknown table expression identifier 'fetch_events'")
        return ["c"], [[1]]

    got = window_data(DataRequest("1h", tuple(NAMES)), panels(), query)
    assert got["store_error"] is None
    assert "Unknown table" in got["panels"]["target_health"]["error"]
    assert got["panels"]["good_pages"]["rows"] == [[1]]

    def held(sql: str) -> tuple[list[str], list[list[Any]]]:
        raise StoreHeldError("the store at /x is open in a reader", None, False)

    got = window_data(DataRequest("1h", tuple(NAMES)), panels(), held)
    assert got["store_error"] == "the store at /x is open in a reader" and not got["panels"]


def test_capping_wraps_the_view() -> None:
    assert capped("SELECT 1", 10) == "SELECT * FROM (\nSELECT 1\n) LIMIT 11"


def test_the_approved_set_is_unknown_until_read() -> None:
    from core.errors import KafkaStageError

    approved = ApprovedSet(lambda: {"b", "a"})
    assert approved.snapshot()["tuples"] is None
    approved.refresh()
    assert approved.snapshot()["tuples"] == ["a", "b"]

    def down() -> set[str]:
        raise KafkaStageError("cannot read crawl.control")

    broken = ApprovedSet(down)
    broken.refresh()
    assert broken.snapshot()["tuples"] is None
    assert "unknown" in broken.snapshot()["note"]


# --- the server ------------------------------------------------------------------------------


def _serve(check: Callable[[TestClient[Any, Any], Dashboard], Any]) -> None:
    async def main() -> None:
        dash = Dashboard(FakeStore({}, age=-1), token=TOKEN)
        async with TestClient(TestServer(dash.app(), host="127.0.0.1")) as client:
            dash.port = client.port or 0
            await check(client, dash)
    asyncio.run(main())


def test_the_server_refuses_without_the_token_and_trades_it_for_a_cookie() -> None:
    async def check(client: TestClient[Any, Any], dash: Dashboard) -> None:
        for path in ("/", "/api/panels", "/api/data", "/static/dashboard.js"):
            resp = await client.get(path)
            assert resp.status == 403, path
        resp = await client.get(f"/?token={TOKEN}", allow_redirects=False)
        assert resp.status == 303 and resp.headers["Location"] == "/"
        assert "HttpOnly" in resp.headers["Set-Cookie"]
        assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
        page = await client.get("/")  # the cookie jar has it now
        assert page.status == 200 and "dashboard.js" in await page.text()
        meta = await (await client.get("/api/panels")).json()
        assert [p["name"] for p in meta["panels"]] == NAMES
        assert meta["windows"] == ["15m", "1h", "24h", "all"]
        bad = await client.get("/api/data?window=1h&sql=SELECT%201")
        assert bad.status == 400 and "unknown parameter" in (await bad.json())["error"]
        ok = await client.get("/api/data?window=15m&panel=good_pages")
        body = await ok.json()
        assert ok.status == 200 and list(body["panels"]) == ["good_pages"]
        assert body["since_s"] == 900
        cross = await client.get("/api/data", headers={"Origin": "http://evil.example"})
        assert cross.status == 403
        assert (await client.get("/static/../server.py")).status in (403, 404)
        assert (await client.get("/static/nothing.js")).status == 404
        assert (await client.post("/api/data")).status == 405
    _serve(check)


def test_serve_binds_loopback_prints_the_url_and_stops() -> None:
    import aiohttp

    from crawlfleet.dashboard.server import serve

    async def main() -> None:
        dash = Dashboard(FakeStore({}))
        stop = asyncio.Event()
        urls: list[str] = []
        task = asyncio.create_task(serve(dash, 0, urls.append, stop))
        while not urls:
            await asyncio.sleep(0.01)
        (url,) = urls
        assert url.startswith(f"http://127.0.0.1:{dash.port}/?token=") and dash.port > 0
        # A jar that keeps cookies of an IP address, as a browser does (aiohttp's does not).
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as session, session.get(url) as resp:
            # It followed the 303, the cookie with it.
            assert resp.status == 200 and str(resp.url).endswith(f":{dash.port}/")
        stop.set()
        await task
    asyncio.run(main())


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    from typer.testing import CliRunner

    from crawlfleet.cli import app
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = CliRunner().invoke(app, ["dashboard", "--port", str(port), "--no-approvals",
                                       "--data-dir", str(tmp_path)])
    assert out.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in out.output
