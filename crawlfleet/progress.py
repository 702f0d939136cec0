"""What a crawl shows while it runs: its progress line (or live table), and what its
workers' status files say that the lags cannot: a worker still starting, a paused crawl."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from schemas.stages import stage_spec, stages_where

if TYPE_CHECKING:
    from crawlfleet.fleet import Fleet


def starting_stages(fleet: Fleet, statuses: list[dict[str, Any]]) -> set[str]:
    """Stages with a live worker process that has not written its first status yet: it is
    starting (importing, joining), not stalled. A resumed crawl's stale status files (of
    processes gone) do not make a starting stage look stalled either."""
    reported = {st.get("pid") for st in statuses}
    return {wid.rsplit("-", 1)[0] for wid, p in fleet.procs.items()
            if p.poll() is None and p.pid not in reported}


def paused_notes(statuses: list[dict[str, Any]]) -> list[str]:
    """"paused" while the fetch workers say the crawl is paused (`crawlfleet pause`)."""
    fetchers = [st for st in statuses if st.get("stage") in stages_where("sends_requests")]
    if fetchers and any(st.get("gauges", {}).get("paused") for st in fetchers):
        return ["paused: no request goes out until `crawlfleet resume`"]
    return []


def _totals(statuses: list[dict[str, Any]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for s in statuses:
        for k, v in s.get("counters", {}).items():
            totals[f"{s['stage']}.{k}"] = totals.get(f"{s['stage']}.{k}", 0) + v
    return totals


def _progress_line(statuses: list[dict[str, Any]], lags: dict[str, int],
                   elapsed: float, notes: list[str] | None = None) -> str:
    """The live table's figures as one plain line (output that is not a terminal), and
    what holds the crawl (stalled stages, work the broker holds), if anything."""
    totals = _totals(statuses)
    return (f"{elapsed:5.0f}s  fetched {totals.get('fetch.fetched', 0)}  stored "
            f"{totals.get('store.stored_pages', 0)}  retries {totals.get('fetch.retries', 0)}  "
            f"dead {totals.get('fetch.dead', 0) + totals.get('parse.dead', 0)}  queues: "
            + " ".join(f"{stage} {_lag_text(lag)}" for stage, lag in lags.items())
            + "".join(f"  | {n}" for n in notes or ()))


def _lag_text(lag: int) -> str:
    """A stage's lag as shown: ``?`` while a partition's end offset is unknown (the probe's
    -1: a look that did not answer in time), never a number that is not one."""
    return "?" if lag < 0 else str(lag)


def _progress_table(statuses: list[dict[str, Any]], lags: dict[str, int],
                    elapsed: float, notes: list[str] | None = None) -> Table:
    totals = _totals(statuses)
    t = Table(title=f"crawlfleet — {elapsed:.0f}s", show_header=True,
              caption="\n".join(notes or ()) or None, caption_style="bold red")
    queues = [stage_spec(stage).label or stage for stage in lags]
    queues[0] = f"queue: {queues[0]}"
    for col in ("fetched", "stored", "retries", "dead", *queues):
        t.add_column(col, justify="right")
    t.add_row(str(totals.get("fetch.fetched", 0)), str(totals.get("store.stored_pages", 0)),
              str(totals.get("fetch.retries", 0)),
              str(totals.get("fetch.dead", 0) + totals.get("parse.dead", 0)),
              *(_lag_text(lag) for lag in lags.values()))
    return t


def kafka_reason(exc: BaseException) -> str:
    """A client error as a person reads it: "KafkaError{code=_TRANSPORT,val=-195,str=
    "Failed to get metadata: ..."}" becomes "Failed to get metadata: ... (_TRANSPORT)"."""
    err = exc.args[0] if exc.args else exc
    if hasattr(err, "str") and hasattr(err, "name"):
        return f"{err.str()} ({err.name()})"
    return str(exc)
