"""The dashboard in a real browser (Debian's headless Chromium, driven by Playwright) on a
real crawl of the demo site, on the real broker and the embedded chDB store.

One test, in the order an operator meets it: refused without the token, loaded with it
(the token then in an HttpOnly cookie); every panel holds the figures that
``crawlfleet sql --view NAME --since S`` prints for the same window; the time control
changes them; a second crawl's pages arrive without a reload, read while its store worker
runs; no console error and no request beyond 127.0.0.1. It writes a screenshot
(``DASHBOARD_SCREENSHOT``, set by ``make dashboard-screenshot`` to docs/dashboard.png).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import create_all_topics, wait_until
from typer.testing import CliRunner

from core.config import Settings
from core.versions import VersionTuple
from crawlfleet.cli import app
from crawlfleet.crawl import Plan, run_crawl, settings_env
from crawlfleet.dashboard.panels import PANELS
from producers import control
from sites.demo_pages import demo_spec
from sites.demo_server import DemoSite, free_port

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
#: The other hosts' addresses are the demo's (127.0.0.2-.4); the second crawl's site runs on
#: the same hosts, on another port, so its pages are new pages.
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: A tuple no worker runs as: approved on the dashboard's own control topic, so the crawl's
#: real tuple is shown as unapproved (the crawls run in namespaces of their own and never
#: see it).
OTHER_TUPLE = "bundle=x;http=y;tls=z;code=elsewhere"


def _browser() -> Any:
    """Playwright's Chromium on Debian's binary: never a downloaded browser, never a skip."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install it with `make sysdeps` "
                    "(apt-get install -y chromium chromium-driver)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: `pip install -e '.[dev]'`")
    return sync_playwright


@pytest.fixture
def dashboard(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Settings]]:
    """``crawlfleet dashboard`` as a user starts it (its own process), its URL read from
    the first line it prints; stopped at the end."""
    s = settings.replace(sample_interval_s=1.0)
    create_all_topics(s)
    control.approve(s, [VersionTuple.parse(OTHER_TUPLE)])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")},
           **settings_env(s)}
    log = (tmp_path / "dashboard.err").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "crawlfleet.cli", "dashboard", "--port",
                             "0", "--refresh", "1"], env=env, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dashboard: http://127.0.0.1:"), \
            line + (tmp_path / "dashboard.err").read_text()
        yield line.split()[1], s
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _cli_rows(s: Settings, view: str, since_s: int) -> list[dict[str, Any]]:
    """What ``crawlfleet sql --view VIEW --since {since_s}s --format json`` prints."""
    out = CliRunner().invoke(app, ["sql", "--view", view, "--since", f"{since_s}s",
                                   "--format", "json"], env=settings_env(s))
    assert out.exit_code == 0, out.output
    text = out.stdout.strip()
    return json.loads(text) if text else []


def _norm(value: Any) -> Any:
    """A figure as the page shows it and as the CLI prints it, made comparable (the page
    shows NULL as an empty cell)."""
    if value is None:
        return ""
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    text = str(value)
    try:
        return round(float(text), 6)
    except ValueError:
        return text


def _same(dom: list[dict[str, str]], cli: list[dict[str, Any]]) -> bool:
    def key(rows: list[dict[str, Any]]) -> list[tuple[tuple[str, Any], ...]]:
        return sorted(tuple(sorted((k, _norm(v)) for k, v in r.items() if k != "approved"))
                      for r in rows)
    return key(dom) == key(cli)


#: Every panel's table (a chart's figures too) as the DOM holds it: {panel: [{col: text}]}.
READ_PANELS = """() => Object.fromEntries([...document.querySelectorAll('section.panel')].map(
  sec => [sec.dataset.panel, [...sec.querySelectorAll('table.data tbody tr')].map(tr =>
    Object.fromEntries([...tr.querySelectorAll('td')].map(td =>
      [td.dataset.col, td.textContent])))]))"""


def _wait_js(page: Any, expression: str, timeout: float = 30.0) -> Any:
    """Poll ``expression`` in the page until truthy (not ``wait_for_function``: it evals a
    string in the page, which the dashboard's Content-Security-Policy rightly refuses)."""
    deadline = time.monotonic() + timeout
    while not (value := page.evaluate(expression)):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {expression}; "
                                 f"status: {page.inner_text('#status')}")
        page.wait_for_timeout(100)
    return value


def _rendered(page: Any, after: int) -> int:
    """Wait for a render newer than ``after``; its sequence number."""
    return int(_wait_js(page, f"Number(document.body.dataset.seq || 0) > {after} && "
                              "document.body.dataset.seq"))


def _check_window(page: Any, s: Settings) -> dict[str, list[dict[str, str]]]:
    """Every panel against ``crawlfleet sql --view`` for the window the page shows."""
    since = int(page.evaluate("document.body.dataset.since"))
    shown = page.evaluate(READ_PANELS)
    for p in PANELS:
        cli = _cli_rows(s, p.name, since)
        assert _same(shown[p.name], cli), (p.name, since, shown[p.name], cli)
        if not cli:  # an empty panel says why
            text = page.inner_text(f"#panel-{p.name} .empty")
            assert text == p.empty, (p.name, text)
    return dict(shown)


def test_dashboard_in_a_browser_on_a_crawl(dashboard: tuple[str, Settings],
                                           tmp_path: Path) -> None:
    url, s = dashboard
    base = url.split("/?")[0]
    one_off = s.replace(topic_prefix="", partitions=0)
    first, second = (demo_spec(p, HOSTS) for p in (
        free_port(HOSTS, 18640), free_port(HOSTS, 18700)))
    with DemoSite(first):
        assert run_crawl(one_off, first.seeds(), Plan(), timeout_s=240).drained
    sync_playwright = _browser()
    with sync_playwright() as pw:
        # As root (CI) Chromium needs --no-sandbox; a container's small /dev/shm, the other.
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        requests: list[str] = []
        problems: list[str] = []
        page = context.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))

        refused = page.goto(base + "/")
        assert refused is not None and refused.status == 403
        assert "no valid token" in page.inner_text("body")
        problems.clear()  # the 403 itself is logged by the browser as a failed load

        loaded = page.goto(url)
        assert loaded is not None and loaded.status == 200 and page.url == base + "/"
        (cookie,) = context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        seq = _rendered(page, 0)
        page.evaluate("window.__sameLoad = true")

        # 1 h: every panel holds sql --view's figures; the crawl's tuple is not approved.
        assert "(3600 s, buckets of 60 s)" in page.inner_text("#status")
        shown = _check_window(page, s)
        assert sum(int(r["good_pages"]) for r in shown["good_pages"]) > 0
        assert shown["target_health"] and shown["queue_depth"]
        assert all(r["approved"] == "unapproved" for r in shown["version_success"])

        # Target health sorts by a column's header: descending, then ascending.
        col = "#panel-target_health th[data-col='requests']"
        cells = ("() => [...document.querySelectorAll(\"#panel-target_health tbody "
                 "td[data-col='requests']\")].map(c => Number(c.textContent))")
        page.click(col)
        desc = page.evaluate(cells)
        page.click(col)
        asc = page.evaluate(cells)
        assert desc == sorted(desc, reverse=True) and asc == sorted(asc) and len(asc) == 3

        # The time control: 15 min buckets by 30 s, where 1 h bucketed by 60 s.
        page.click("#windows button[data-window='15m']")
        _wait_js(page, "document.body.dataset.since === '900'")
        seq = _rendered(page, seq)
        assert "(900 s, buckets of 30 s)" in page.inner_text("#status")
        fifteen = _check_window(page, s)
        assert all(r["time"][17:19] in ("00", "30") for r in fifteen["good_pages"])
        assert sum(int(r["pages"]) for r in fifteen["good_pages"]) == \
            sum(int(r["pages"]) for r in shown["good_pages"])  # the same pages, rebucketed
        page.click("#windows button[data-window='all']")
        _wait_js(page, "document.body.dataset.window === 'all'")
        seq = _rendered(page, seq)
        _check_window(page, s)
        page.click("#windows button[data-window='1h']")
        _wait_js(page, "document.body.dataset.since === '3600'")
        seq = _rendered(page, seq)

        # A second crawl, run as a user runs one (`crawlfleet crawl`): its pages show up on
        # their own, the page refreshing (through the store worker) while it runs.
        pages_before = sum(int(r["pages"]) for r in page.evaluate(READ_PANELS)["good_pages"])
        seeds = tmp_path / "seeds.txt"
        seeds.write_text("\n".join(second.seeds()) + "\n")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRAWLFLEET_")},
               **settings_env(one_off)}
        during: list[int] = []
        with DemoSite(second):
            crawl = subprocess.Popen([sys.executable, "-m", "crawlfleet.cli", "crawl",
                                      str(seeds)], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
            statuses: list[str] = []
            while crawl.poll() is None:
                during.append(int(page.evaluate("document.body.dataset.seq")))
                statuses.append(page.inner_text("#status"))
                page.wait_for_timeout(500)
            output = crawl.communicate()[0]
        ended = time.time()
        assert crawl.returncode == 0, output
        assert during and max(during) > min(during), (during, statuses)  # refreshed all along
        new_pages = len(second.expected())

        def caught_up() -> int:
            rows = page.evaluate(READ_PANELS)["good_pages"]
            total = sum(int(r["pages"]) for r in rows)
            return total if total >= pages_before + new_pages else 0

        wait_until(caught_up, 30, "the second crawl's pages on the page")
        assert page.evaluate("window.__sameLoad === true")  # no reload
        # Figures queried after the crawl's store worker wrote its last sample.
        _wait_js(page, f"Date.parse(document.body.dataset.at) > {ended * 1000:.0f}")
        _check_window(page, s)

        # The picture README shows: both crawls over the store's whole span.
        page.click("#windows button[data-window='all']")
        _wait_js(page, "document.body.dataset.window === 'all'")
        _rendered(page, int(page.evaluate("document.body.dataset.seq")))
        page.evaluate("window.scrollTo(0, 0)")  # the sticky header at the top of the picture
        shot = Path(os.environ.get("DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000
        browser.close()

    assert problems == [], problems
    assert requests and all(r.startswith(base + "/") for r in requests), requests
