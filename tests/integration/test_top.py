"""``crawlfleet top`` on a live crawl, in a real terminal (tmux), its screen captured."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from fleet_helpers import Workers, create_all_topics, publish_seeds, wait_until

from core.config import Settings
from crawlfleet.crawl import settings_env
from producers import control
from sites.behaviour_site import Behaviour, BehaviourSite
from sites.demo_server import free_port

pytestmark = pytest.mark.integration

HOST, QUIET = "127.0.0.2", "127.0.0.3"


def _screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                          text=True, check=True).stdout


def test_top_shows_the_fleet_live(settings: Settings, fleet: Callable[[Settings], Workers],
                                  tmp_path: Path) -> None:
    s = settings.replace(rate_cap=5.0)
    port = free_port((HOST, QUIET), 18895)
    with BehaviourSite(port, {HOST: Behaviour(), QUIET: Behaviour(status=403)}) as site:
        create_all_topics(s)
        ws = fleet(s)
        ws.start_pipeline(fetch=2)
        ws.start("revisit")  # every stage of the topology staffed: the fleet runs
        publish_seeds(s, site.urls(HOST, 200) + site.urls(QUIET, 3))
        wait_until(lambda: len(site.pages()) >= 10, 60, "the crawl under way")
        control.pause(s, QUIET)  # targets are hosts (target_mode host)
        script = tmp_path / "top.sh"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in settings_env(s).items())
        # The terminal's own size: not a LINES/COLUMNS inherited from the test process.
        script.write_text(f"exec env -u LINES -u COLUMNS {env} {shlex.quote(sys.executable)} "
                          "-m crawlfleet.cli top --refresh 1\n")
        session = f"top-{uuid.uuid4().hex[:8]}"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "60",
                        f"bash {shlex.quote(str(script))}"], check=True)
        try:
            time.sleep(3)  # a few refreshes: the trend grows
            # A whole frame (a capture can fall in the middle of a redraw: look again).
            screen = wait_until(lambda: (lambda t: t if "fetch workers" in t and "▁" in t
                                         and "paused targets:" in t else "")(_screen(session)),
                                60, "top to draw the whole fleet")
            control.pause(s)
            paused = wait_until(lambda: (lambda t: t if "PAUSED" in t else "")(
                _screen(session)), 30, "top to show the pause")
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], check=False)
            control.resume(s)
    print("\n--- crawlfleet top, captured from tmux ---\n" + screen)
    assert "crawlfleet top — fleet running" in screen
    for stage in ("fetch", "parse", "store", "retry"):
        assert stage in screen
    assert "2: fetch-0, fetch-1" in screen  # the fetch group's members, from Kafka
    assert f"paused targets: {QUIET}" in screen
    assert HOST in screen and QUIET in screen  # targets pushing back, from the store
    assert "fleet PAUSED" in paused
