"""The dashboard's panels: each is one view of ``infra/sql/views`` (its SQL, its title) plus
how to draw it and why it may be empty. The views stay the one source: a view without a
panel, or a panel without a view, fails the unit tests."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from infra.views import View, load_views

#: Why a panel fed by the store worker's queue samples is empty or flat.
NEEDS_SAMPLES = ("needs one sample interval: the store worker samples every stage's queue "
                 "every sample_interval_s (10 s) while it runs; no sample in this window")
NO_REQUESTS = "no request in this window: nothing was fetched"


@dataclass(frozen=True)
class Panel:
    """How one view is shown.

    ``kind`` ``series``: a chart over the view's ``time`` column, one line per value of
    ``series_by`` (or per column of ``values`` when it is None); ``table``: a sortable table
    of every column. ``empty`` is what the panel says when the window has no row."""

    name: str
    kind: str
    empty: str
    values: tuple[str, ...] = ()
    series_by: str | None = None
    unit: str = ""
    #: A table's columns to set off (the version panel: share of requests beside failures).
    highlight: tuple[str, ...] = ()
    #: A table's columns shown right after its first (what to read first, side by side).
    lead: tuple[str, ...] = ()
    #: The panel marks rows whose ``version_tuple`` is not in the approved set.
    approval: bool = False
    wide: bool = False
    title: str = field(default="", compare=False)

    def describe(self) -> dict[str, Any]:
        """What the page needs to lay the panel out (JSON)."""
        return asdict(self)


#: Page order: the flow of work first, then the targets, the fleet's versions, quarantines.
PANELS: tuple[Panel, ...] = (
    Panel("good_pages", "series", "no page stored in this window",
          values=("good_pages", "pages"), unit="pages"),
    Panel("throughput", "series", NEEDS_SAMPLES, values=("records_per_s",),
          series_by="stage", unit="records/s"),
    Panel("queue_depth", "series", NEEDS_SAMPLES, values=("lag",), series_by="stage",
          unit="records"),
    Panel("oldest_task_age", "series", NEEDS_SAMPLES, values=("oldest_age_s",),
          series_by="stage", unit="s"),
    Panel("dead_by_reason", "series", "no dead letter in this window: nothing failed for good",
          values=("dead_letters",), series_by="reason", unit="dead letters"),
    Panel("target_health", "table", NO_REQUESTS,
          highlight=("block_rate", "retry_rate", "not_found_rate"), wide=True),
    Panel("identity_health", "table", NO_REQUESTS,
          highlight=("block_rate", "throttle_rate", "error_rate"), wide=True),
    Panel("slow_targets", "table", NO_REQUESTS, highlight=("block_rate", "p95_ms"),
          wide=True),
    Panel("worker_success", "table", NO_REQUESTS, highlight=("success_rate",)),
    Panel("version_success", "table", NO_REQUESTS,
          highlight=("share_of_requests", "share_of_failures"),
          lead=("share_of_requests", "share_of_failures", "success_rate", "requests"),
          approval=True, wide=True),
    Panel("version_pages", "table", "no page stored in this window", approval=True),
    Panel("visits", "table", "no visit in this window: no page was fetched or revisited",
          highlight=("change_rate",)),
    Panel("revisits", "table", "no revisit due, planned or done: no target's revisit policy "
          "planned one, or none came in this window", highlight=("due_now", "late_max_s")),
    Panel("quarantine_list", "table",
          "no quarantine in this window: no identity or target was retired", wide=True),
    Panel("quarantines", "table", "no quarantine in this window"),
)


def panels(views: dict[str, View] | None = None) -> dict[str, tuple[Panel, View]]:
    """Every panel with its view (the title from the view's ``-- title:`` line)."""
    views = load_views() if views is None else views
    out: dict[str, tuple[Panel, View]] = {}
    for p in PANELS:
        view = views[p.name]
        out[p.name] = (Panel(**{**asdict(p), "title": view.title}), view)
    return out


def missing(views: dict[str, View]) -> tuple[set[str], set[str]]:
    """Views without a panel, panels without a view (both empty when they agree)."""
    names = {p.name for p in PANELS}
    return set(views) - names, names - set(views)


def check_shape(panel: Panel, view: View) -> list[str]:
    """What is wrong between a panel and its view's text (series need a time bucket, and
    every named column must be in the query)."""
    errors = []
    if (panel.kind == "series") != view.is_series:
        errors.append(f"{panel.name}: a {panel.kind} panel, but the view "
                      f"{'is' if view.is_series else 'is not'} bucketed by time")
    for col in (*panel.values, *((panel.series_by,) if panel.series_by else ()),
                *panel.highlight, *panel.lead):
        if col not in view.sql:
            errors.append(f"{panel.name}: no column {col} in the view")
    if panel.approval and "version_tuple" not in view.sql:
        errors.append(f"{panel.name}: marks approvals but has no version_tuple")
    return errors
