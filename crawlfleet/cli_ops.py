"""Operator commands: pause, resume and live caps, chaos and soak, SQL and ``top``, dead
letters and lineage, the capacity plan, ``doctor``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from core.errors import CrawlfleetError
from crawlfleet.cli_base import (
    BootstrapOpt,
    ClickhouseOpt,
    ConfigOpt,
    CrawlOpt,
    DataDirOpt,
    PrefixOpt,
    TargetOpt,
    _error,
    _fail,
    _settings,
    cell,
    command,
    console,
    crawl_name,
    crawl_settings,
    err_console,
    setting_help,
)

# --- control -------------------------------------------------------------------------------

def _toggle(paused: bool, target: str | None, config: Path | None, bootstrap: str | None,
            topic_prefix: str | None, data_dir: Path | None) -> None:
    from producers import control
    send = control.pause if paused else control.resume
    try:
        s = crawl_settings(config, bootstrap, topic_prefix, data_dir)
        send(s, target)
    except CrawlfleetError as exc:
        _fail(exc)
    console.print(f"{'paused' if paused else 'resumed'} {target or 'every target'} of "
                  f"{crawl_name(s)}", markup=False)


@command("pause")
def pause_cmd(target: TargetOpt = None, config: ConfigOpt = None,
              bootstrap: BootstrapOpt = None, topic_prefix: CrawlOpt = None,
              data_dir: DataDirOpt = None) -> None:
    """Stop every fetch worker of the crawl from dequeuing (globally or for one target);
    nothing is lost: `crawlfleet resume` goes on where it stopped."""
    _toggle(True, target, config, bootstrap, topic_prefix, data_dir)


@command("resume")
def resume_cmd(target: TargetOpt = None, config: ConfigOpt = None,
               bootstrap: BootstrapOpt = None, topic_prefix: CrawlOpt = None,
               data_dir: DataDirOpt = None) -> None:
    """Undo `crawlfleet pause` (globally or for one target)."""
    _toggle(False, target, config, bootstrap, topic_prefix, data_dir)


@command("unquarantine")
def unquarantine_cmd(target: Annotated[str, typer.Argument(
                         metavar="TARGET", help="The target (host) to lift it on.")],
                     profile_name: Annotated[str | None, typer.Option(
                         "--profile", help="Lift this profile's quarantine on TARGET. "
                                          "[default: the target pause]")
                     ] = None,
                     egress_name: Annotated[str | None, typer.Option(
                         "--egress", help="Lift this egress's quarantine on TARGET. "
                                         "[default: the target pause]")
                     ] = None,
                     config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
                     topic_prefix: CrawlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Lift a quarantine before it ends: the target pause (default), or one profile's or
    egress's on TARGET (a tombstone on crawl.control; `crawlfleet top` lists them)."""
    from core.errors import KafkaStageError
    from infra.topics import topology_of
    from streams.control import quarantine_key
    from streams.io import Encoder, connected_producer, producer_conf
    if profile_name and egress_name:
        _error("give --profile or --egress, not both")
        raise typer.Exit(2)
    scope, name = ("profile", profile_name) if profile_name else \
        ("egress", egress_name) if egress_name else ("target", "")
    key = quarantine_key(scope, target, name or "")
    try:
        s = crawl_settings(config, bootstrap, topic_prefix, data_dir)
        out = Encoder(topology_of(s), "control").control(key, None)
        producer = connected_producer(producer_conf(s, "crawlfleet-control"))
        producer.produce(out.topic, key=out.key, value=None, partition=out.partition)
        if producer.flush(30):
            raise KafkaStageError(f"control record {key} was not delivered")
    except CrawlfleetError as exc:
        _fail(exc)
    console.print(f"lifted the {scope} quarantine {target}|{name or ''}", markup=False)


@command("cap")
def cap_cmd(target: Annotated[str, typer.Argument(metavar="TARGET", help="Target (host).")],
            rate: Annotated[float | None, typer.Argument(
                metavar="RATE", help="Requests per second; omit to clear the live cap.")
            ] = None,
            config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
            topic_prefix: CrawlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Set a live per-target rate cap for every fetch worker of the crawl (through
    crawl.control)."""
    from producers import control
    if rate is not None and rate <= 0:
        _error("rate must be > 0")
        raise typer.Exit(2)
    try:
        s = crawl_settings(config, bootstrap, topic_prefix, data_dir)
        control.set_cap(s, target, rate)
    except CrawlfleetError as exc:
        _fail(exc)
    console.print(f"cap for {target} in {crawl_name(s)}: "
                  f"{rate if rate is not None else 'cleared'}", markup=False)


# --- chaos ---------------------------------------------------------------------------------


@command("chaos")
def chaos_cmd(pages: Annotated[int | None, typer.Option(
                  help="Pages of the local test site. [default: 5000; with --soak 1500]")
              ] = None,
              hosts: Annotated[int | None, typer.Option(
                  help="Hosts the pages are spread over. [default: 20; with --soak 8]")
              ] = None,
              rate_cap: Annotated[float, typer.Option(
                  help="Requests/s per host (the crawler's default is 2); 0: a pace that "
                       "makes the crawl last about a minute.")] = 2.0,
              nodes: Annotated[int | None, typer.Option(
                  help="Kafka nodes: 1, or 3 with a broker killed and restarted mid-crawl "
                       "[default: 1; with --soak 3]")] = None,
              fetch_workers: Annotated[int, typer.Option(help="Fetch worker processes.")] = 2,
              parse_workers: Annotated[int, typer.Option(help="Parse worker processes.")] = 2,
              kill_every: Annotated[float, typer.Option(
                  help="Seconds between kills (each drawn from 0.75x..1.25x).")] = 8.0,
              kill_for: Annotated[float, typer.Option(
                  help="Stop killing after seconds (0: once 90% of the pages were "
                       "requested).")] = 0.0,
              baseline: Annotated[bool, typer.Option(
                  "--baseline/--no-baseline",
                  help="Also crawl the same shape with nobody killed, and report the "
                       "throughput retained.")] = True,
              seed: Annotated[int, typer.Option(help="Random seed of the kill schedule.")] = 1,
              data_dir: DataDirOpt = None,
              timeout: Annotated[float, typer.Option(help="Give up a crawl after seconds.")
                                 ] = 900.0,
              report_json: Annotated[Path | None, typer.Option(
                  help="Also write the report as JSON here. [default: none]")] = None,
              soak: Annotated[float, typer.Option(
                  "--soak", metavar="MINUTES",
                  help="Loop rounds of the 3-broker scenario with mixed faults for this "
                       "many minutes; stop at the first round that fails. [default: 0, "
                       "no soak]")] = 0.0,
              faults: Annotated[str, typer.Option(
                  help="Heavy faults the soak mixes, comma-separated. [default: all: "
                       "broker_kill, broker_freeze, restart_all, store_restart, "
                       "state_wipe]")] = "",
              faults_per_round: Annotated[int, typer.Option(
                  help="Heavy faults per soak round, besides the worker kills.")] = 2,
              results: Annotated[Path | None, typer.Option(
                  help="The soak's results file. [default: bench/soak_results.jsonl]")
              ] = None,
              summary: Annotated[bool, typer.Option(
                  "--summary", help="Print the soak results' totals per commit and exit. "
                  "[default: off]")] = False) -> None:
    """Crawl a local site while killing (-9) workers; report losses, duplicates, pace kept.

    Defaults: issue 11's scenario (20 hosts x 250 pages at 2 req/s per host; 2 fetch, 2 parse,
    store, retry; a kill every 8 s; default session timeout), then the same with no kills.
    Exit 1 unless nothing was lost or duplicated, over-apply kept its bound and (with the
    baseline) >= 80% of the no-kill pace was retained. With --soak, rounds of worker kills
    plus broker kills, frozen brokers, whole-cluster restarts, store restarts under readers
    and wiped local state, each round appended to the results file; exit 1 if one failed.
    """
    if summary:
        from chaos import soak as soak_mod
        rounds = soak_mod.read_results(results or soak_mod.RESULTS)
        console.print(soak_mod.summary_table(soak_mod.summarise(rounds)))
        return
    if soak:
        _soak(soak, pages=pages or 1500, hosts=hosts or 8, nodes=nodes or 3,
              rate_cap=rate_cap, fetch_workers=fetch_workers, parse_workers=parse_workers,
              kill_every=kill_every, seed=seed, data_dir=data_dir, timeout=timeout,
              faults=faults, faults_per_round=faults_per_round, results=results)
        return
    from chaos import proof
    from chaos import report as chaos_report
    try:
        report = proof.run_chaos(pages=pages or 5000, nodes=nodes or 1,
                                 fetch_workers=fetch_workers, parse_workers=parse_workers,
                                 kill_every_s=kill_every, seed=seed, data_dir=data_dir,
                                 timeout_s=timeout, console=err_console,
                                 rate_cap=rate_cap or None, hosts=hosts or 20,
                                 baseline=baseline, kill_for_s=kill_for or None)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    chaos_report.print_report(report, console)
    if report_json:
        chaos_report.write_json(report, report_json)
    good = report.meets_target if baseline else report.ok and report.within_bound
    if not good:
        raise typer.Exit(1)


def _soak(minutes: float, *, pages: int, hosts: int, nodes: int, rate_cap: float,
          fetch_workers: int, parse_workers: int, kill_every: float, seed: int,
          data_dir: Path | None, timeout: float, faults: str, faults_per_round: int,
          results: Path | None) -> None:
    from chaos import soak as soak_mod
    from chaos.fault_plan import HEAVY
    kinds = tuple(k.strip() for k in faults.split(",") if k.strip()) or HEAVY
    cfg = soak_mod.SoakConfig(
        minutes=minutes, pages=pages, hosts=hosts, nodes=nodes, rate_cap=rate_cap or 2.0,
        fetch_workers=fetch_workers, parse_workers=parse_workers, kill_every_s=kill_every,
        seed=seed, data_dir=data_dir, round_timeout_s=min(timeout, 600.0), kinds=kinds,
        heavy_per_round=faults_per_round, results=results or soak_mod.RESULTS)
    try:
        outcome = soak_mod.run_soak(cfg, err_console)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    console.print(soak_mod.summary_table(soak_mod.summarise(
        soak_mod.read_results(cfg.results))))
    if outcome.error:
        err_console.print(f"[red]soak stopped: {outcome.error}[/red]")
        raise typer.Exit(1)
    if outcome.failed is not None:
        err_console.print(f"[red]soak stopped: round {len(outcome.rounds) - 1} failed "
                          f"({'; '.join(outcome.failed.failures)}); evidence in "
                          f"{outcome.failed.evidence}[/red]")
        raise typer.Exit(1)


# --- sql -----------------------------------------------------------------------------------


@command("sql")
def sql_cmd(query: Annotated[str | None, typer.Argument(
                metavar="QUERY", help="SQL, e.g. 'SELECT * FROM pages_v' (or use --view)")
            ] = None,
            view: Annotated[str | None, typer.Option(
                "--view", help="A dashboard view by name (infra/sql/views); "
                "`--view list` names them. [default: none]")] = None,
            since: Annotated[str, typer.Option(
                help="The view's time window, ending now: 90s, 15m, 6h, 7d.")] = "1h",
            config: ConfigOpt = None, clickhouse: ClickhouseOpt = None,
            data_dir: DataDirOpt = None,
            format: Annotated[str, typer.Option(help="table | tsv | json")] = "table"
            ) -> None:
    """Query the crawl store (while a crawl runs, through its store process)."""
    import json as _json

    from rich.markup import escape

    from core.errors import QueryError
    from infra.store_query import run_query
    from infra.views import expand, load_views, parse_duration
    views = load_views()
    if view == "list" or (query is None and view is None):
        for v in views.values():
            console.print(f"{v.name:18} {v.title}")
        return
    if view is not None:
        if view not in views:
            _error(f"no view {view!r}; views: " + ", ".join(views))
            raise typer.Exit(2)
        try:
            query = expand(views[view].sql, parse_duration(since))
        except CrawlfleetError as exc:
            _fail(exc)
            return
    assert query is not None
    try:
        s = _settings(config, clickhouse=clickhouse, data_dir=data_dir)
        cols, rows = run_query(s, query, on_wait=lambda text: err_console.print(
            f"[yellow]{escape(text)}[/yellow]"))
    except QueryError as exc:
        _error(str(exc))
        try:
            _, names = run_query(s, "SHOW TABLES")
            err_console.print("tables and views: " + ", ".join(str(n[0]) for n in names),
                              markup=False)
        except CrawlfleetError:
            pass
        raise typer.Exit(2) from None
    except CrawlfleetError as exc:
        _fail(exc)
        return
    if format == "json":
        console.print_json(_json.dumps([dict(zip(cols, r, strict=True)) for r in rows],
                                       default=str))
    elif format == "tsv":
        sys.stdout.write("\t".join(cols) + "\n")
        for r in rows:
            sys.stdout.write("\t".join(str(v) for v in r) + "\n")
    elif not rows:
        console.print("0 rows" + (f" ({', '.join(cols)})" if cols else ""), markup=False,
                      highlight=False)
    else:
        t = Table(*cols)
        for r in rows:
            t.add_row(*(cell(v) for v in r))
        console.print(t)


def _print_graph(config: Path | None) -> None:
    """The topology graph of every declared stage, the ``stage_modules`` ones included."""
    from schemas.graph import draw
    try:
        _settings(config)  # loads the stage modules the configuration names
    except CrawlfleetError as exc:
        _fail(exc)
        return
    for line in draw():
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@command("top")
def top_cmd(config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
            topic_prefix: CrawlOpt = None, clickhouse: ClickhouseOpt = None,
            data_dir: DataDirOpt = None,
            refresh: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 2.0,
            once: Annotated[bool, typer.Option(
                "--once", help="Print one snapshot and exit (piped output always does). "
                "[default: off]")] = False,
            graph: Annotated[bool, typer.Option(
                "--graph", help="Print the topology (which stage writes each topic, which "
                "reads it, each stage's stores) from the stage declarations and exit; needs "
                "no broker. [default: off]")] = False) -> None:
    """A live view of the whole fleet: queues and their trend, throughput, workers and their
    versions, block rate, dead letters, paused targets."""
    import time as _time

    from rich.live import Live

    from crawlfleet.top import FleetView, render
    if graph:
        _print_graph(config)
        return
    try:
        s = crawl_settings(config, bootstrap, topic_prefix, data_dir, clickhouse=clickhouse)
        view = FleetView(s)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    try:
        if once or not console.is_terminal:
            # A rate is the difference of two samples: the one printed is the second,
            # ``refresh`` seconds after the first (one alone showed 0.0 records/s).
            view.snapshot()
            _time.sleep(refresh)
            console.print(render(view.snapshot()))
            return
        with Live(render(view.snapshot()), console=console, screen=True,
                  auto_refresh=False) as live:
            while True:
                _time.sleep(refresh)
                live.update(render(view.snapshot()), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        view.close()


# --- lineage (dead letters: cli_dlq) ---------------------------------------------------------

def _print_rows(cols: Any, rows: Any) -> None:
    if not rows:
        console.print("0 rows", markup=False, highlight=False)
        return
    t = Table(*cols)
    for r in rows:
        t.add_row(*(cell(v) for v in r))
    console.print(t)


@command("trace")
def trace_cmd(url: Annotated[str, typer.Argument(metavar="URL", help="The URL to follow.")],
              profile: Annotated[str | None, typer.Option(help=setting_help(
                  "Crawl profile.", "default_profile"))] = None,
              format: Annotated[str, typer.Option(help="table | tsv")] = "table",
              crawl: Annotated[str | None, typer.Option("--crawl", "--topic-prefix", help=(
                  "Only this crawl's steps (its name, '' the shared fleet's). [default: every "
                  "crawl of the store, each step named by crawl and visit]"))] = None,
              config: ConfigOpt = None, clickhouse: ClickhouseOpt = None,
              data_dir: DataDirOpt = None) -> None:
    """Where a URL went, when, on which worker and version: each visit, by each crawl."""
    from crawlfleet import trace
    from crawlfleet.crawls import normal_prefix
    try:
        events = trace.trace(_settings(config, clickhouse=clickhouse, data_dir=data_dir), url,
                             profile, crawl=None if crawl is None else normal_prefix(crawl))
    except CrawlfleetError as exc:
        _fail(exc)
        return
    if format == "tsv":
        for row in (trace.COLUMNS, *(e.row() for e in events)):
            sys.stdout.write("\t".join(row) + "\n")
    else:
        _print_rows(trace.COLUMNS, [e.row() for e in events])


# --- profiles ------------------------------------------------------------------------------


@command("profiles")
def profiles_cmd(config: ConfigOpt = None) -> None:
    """List the crawl profiles and egresses of the configuration (proxy passwords redacted)."""
    from core.profiles import EGRESS_COLUMNS, PROFILE_COLUMNS, egress_rows, profile_rows
    try:
        s = _settings(config)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    profiles, egress = s.profile_table, s.egress_table
    configured = "configured" if s.profiles else "implicit: none configured"
    for title, cols, rows in (
            (f"profiles ({configured}; default {s.default_profile})", PROFILE_COLUMNS,
             profile_rows(profiles, egress)),
            ("egress", EGRESS_COLUMNS, egress_rows(profiles, egress))):
        t = Table(*cols, title=title)
        for row in rows:
            t.add_row(*(cell(v) for v in row))
        console.print(t)


# --- plan ----------------------------------------------------------------------------------


@command("plan")
def plan_cmd(pages_per_day: Annotated[float, typer.Option(
                 help="Pages to crawl a day.")],
             targets: Annotated[int, typer.Option(help="Targets (hosts) crawled.")],
             cap: Annotated[float | None, typer.Option(help=setting_help(
                 "Requests per second per target.", "rate_cap"))] = None,
             page_bytes: Annotated[float | None, typer.Option(
                 help="Mean page size, bytes. [default: the measured site's]")] = None,
             backlog: Annotated[float | None, typer.Option(
                 help="Jobs parked, waiting beyond the workers' memory. [default: one day's "
                 "pages, a day's frontier published at once]")] = None,
             costs: Annotated[Path | None, typer.Option(
                 help="Measured per-page costs (python -m bench.cost_bench). "
                 "[default: infra/costs.json]")] = None) -> None:
    """A capacity plan from measured per-page costs: partitions, workers per stage, broker
    and ClickHouse load, and what saturates first."""
    from crawlfleet import plan as plan_mod
    try:
        measured = plan_mod.Costs.load(costs or plan_mod.COSTS)
        limits = plan_mod.NodeLimits(page_bytes=page_bytes, backlog=backlog)
        s = _settings(None)
        rate = cap if cap is not None else s.rate_cap
        result = plan_mod.plan(pages_per_day, targets, rate, measured, limits,
                               seen_ttl_s=s.seen_ttl_s)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    t = Table("what", "figure", title=f"plan: {pages_per_day:,.0f} pages/day over "
              f"{targets:,} targets at {rate:g} req/s")
    for what, figure in plan_mod.render(result, measured, limits):
        t.add_row(cell(what), cell(figure))
    console.print(t)


# --- doctor --------------------------------------------------------------------------------


@command("doctor")
def doctor_cmd(config: ConfigOpt = None, clickhouse: ClickhouseOpt = None,
               data_dir: DataDirOpt = None,
               window: Annotated[float, typer.Option(
                   help="Seconds of fetch telemetry to size leases from.")] = 3600.0,
               bootstrap: BootstrapOpt = None, topic_prefix: PrefixOpt = None,
               kafka: Annotated[bool, typer.Option(
                   "--kafka/--no-kafka", help="Also check the topics on the broker. [default: on]")
               ] = True
               ) -> None:
    """Check the settings against measured fetch durations: each finding with its fix."""
    from crawlfleet import doctor
    try:
        s = _settings(config, clickhouse=clickhouse, data_dir=data_dir, bootstrap=bootstrap,
                      topic_prefix=topic_prefix)
        results, _ = doctor.diagnose(s, window, kafka=kafka)
    except CrawlfleetError as exc:
        _fail(exc)
        return
    t = Table("check", "value", "verdict", "fix", title="crawlfleet doctor")
    colour = {doctor.OK: "green", doctor.WARN: "yellow", doctor.FAIL: "red"}
    for c in results:
        t.add_row(cell(c.name), cell(c.value),
                  Text(c.verdict, style=colour.get(c.verdict, "dim")), cell(c.fix))
    console.print(t)
    if doctor.failed(results):
        raise typer.Exit(1)


# Registered on import: approve, approved, revoke (the approved set of version tuples);
# schema (the store's DDL printed, or a cluster's applied once); dlq list, show, replay.
from crawlfleet import cli_approval, cli_dlq, cli_schema  # noqa: E402,F401
