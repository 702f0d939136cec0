"""The machine user's local broker, found from any folder (issue 44).

A broker's home is ``.crawlfleet/kafka`` under the folder a command runs from, so a crawl
started in another folder found no broker there and tried to start its own on the taken
port. ``crawlfleet kafka up`` (and a crawl that starts the broker) note its home in one
per-user file; a command with no broker configured and none in its own folder uses the
noted one while it runs (its pid files say so: no network round trip).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from infra import kafka_local

#: Where the note lives: ``$XDG_STATE_HOME/crawlfleet`` (default ``~/.local/state``).
STATE_ENV = "XDG_STATE_HOME"


def note_path() -> Path:
    root = os.environ.get(STATE_ENV) or str(Path("~/.local/state").expanduser())
    return Path(root) / "crawlfleet" / "local-broker.json"


def note_broker(home: Path | None = None) -> None:
    """Remember the broker of ``home`` (default: this folder's) as the user's."""
    path = note_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"home": str(kafka_local.kafka_home(home))}))


def noted_bootstrap() -> str:
    """The bootstrap servers of the user's noted broker if it runs, else ""."""
    try:
        home = Path(json.loads(note_path().read_text())["home"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    st = kafka_local.status(home)
    return st.bootstrap_servers if st.running else ""
