"""Dashboard views: SQL files in ``infra/sql/views``, written once in Grafana's macro form.

Each file is one query with a ``-- title:`` line. Its time window is written with the macros
of the Grafana ClickHouse data source (``$__timeFilter(col)``, ``$__timeInterval(col)``,
``$__fromTime``, ``$__toTime``), so the same text is a Grafana panel query
(``infra/grafana/crawlfleet.json``, built by :func:`grafana_dashboard`) and, expanded here for
a window ending now, what ``crawlfleet sql --view NAME --since 1h`` runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError

VIEWS_DIR = Path(__file__).with_name("sql") / "views"
GRAFANA_JSON = Path(__file__).with_name("grafana") / "crawlfleet.json"
#: The plugin's data source type id (grafana-clickhouse-datasource).
DATASOURCE_TYPE = "grafana-clickhouse-datasource"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class View:
    name: str
    title: str
    sql: str  # with the Grafana macros

    @property
    def is_series(self) -> bool:
        """Time series (bucketed by ``$__timeInterval``) rather than a table."""
        return "$__timeInterval(" in self.sql


def load_views(directory: Path = VIEWS_DIR) -> dict[str, View]:
    out: dict[str, View] = {}
    for path in sorted(directory.glob("*.sql")):
        text = path.read_text()
        title = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                      if ln.startswith("-- title:")), path.stem)
        body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("--")).strip()
        out[path.stem] = View(path.stem, title, body)
    return out


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``6h``, ``7d``, ``2w`` → seconds."""
    m = _DURATION.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"not a duration: {text!r} (use e.g. 90s, 15m, 6h, 7d)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def bucket_for(since_s: int) -> int:
    """A bucket size giving a few dozen points over the window (at least 10 s)."""
    for step in (10, 30, 60, 300, 600, 1800, 3600, 21600, 86400):
        if since_s / step <= 60:
            return step
    return 86400


def expand(sql: str, since_s: int, interval_s: int | None = None) -> str:
    """The Grafana macros of ``sql`` for the window ``[now - since_s, now]``, as the plugin
    expands them (``$__timeInterval`` buckets with ``toStartOfInterval``)."""
    step = interval_s or bucket_for(since_s)
    frm = f"(now64(3) - INTERVAL {int(since_s)} SECOND)"
    to = "now64(3)"
    sql = re.sub(r"\$__timeFilter\(\s*([\w.]+)\s*\)",
                 lambda m: f"({m.group(1)} >= {frm} AND {m.group(1)} <= {to})", sql)
    sql = re.sub(r"\$__timeInterval\(\s*([\w.]+)\s*\)",
                 lambda m: f"toStartOfInterval(toDateTime({m.group(1)}), "
                           f"INTERVAL {int(step)} second)", sql)
    return sql.replace("$__fromTime", frm).replace("$__toTime", to)


def grafana_dashboard(views: dict[str, View]) -> dict[str, Any]:
    """A Grafana dashboard: one panel per view, its query the view's text (macros kept)."""
    panels = []
    for i, view in enumerate(views.values()):
        panels.append({
            "id": i + 1,
            "title": view.title,
            "type": "timeseries" if view.is_series else "table",
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "datasource": {"type": DATASOURCE_TYPE, "uid": "${datasource}"},
            "targets": [{
                "refId": "A",
                "datasource": {"type": DATASOURCE_TYPE, "uid": "${datasource}"},
                "editorType": "sql",
                "format": 0 if view.is_series else 1,  # time series / table
                "queryType": "timeseries" if view.is_series else "table",
                "rawSql": view.sql,
            }],
        })
    return {
        "title": "crawlfleet",
        "uid": "crawlfleet",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{
            "name": "datasource", "type": "datasource", "query": DATASOURCE_TYPE,
            "label": "ClickHouse"}]},
        "panels": panels,
    }


def write_grafana(path: Path = GRAFANA_JSON) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(grafana_dashboard(load_views()), indent=2) + "\n")


if __name__ == "__main__":  # python -m infra.views: rebuild the Grafana dashboard JSON
    write_grafana()
