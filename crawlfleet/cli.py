"""The ``crawlfleet`` command line: local infra, topics, publishing, workers, crawl, SQL."""

from __future__ import annotations

import itertools
import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from core.errors import CrawlfleetError

# The operator commands register themselves on ``app`` when imported.
from crawlfleet.cli_base import (
    EXIT_BAD_LINES,
    AllowHostsOpt,
    BootstrapOpt,
    ClickhouseOpt,
    ConfigOpt,
    DataDirOpt,
    KafkaHomeOpt,
    PrefixOpt,
    RateCapOpt,
    _Command,
    _error,
    _fail,
    _on_cluster,
    _settings,
    app,
    cell,
    command,
    console,
    err_console,
    kafka_app,
    setting_help,
    topics_app,
)

# --- kafka ---------------------------------------------------------------------------------


@kafka_app.command("up", cls=_Command)
def kafka_up(nodes: Annotated[int, typer.Option(help="1 or 3 nodes.")] = 1,
             dir: KafkaHomeOpt = None,
             heap_mb: Annotated[int, typer.Option(help="Java heap per node, in MiB.")] = 512
             ) -> None:
    """Start the local broker(s); idempotent. Prints the bootstrap servers."""
    from infra import kafka_local
    from infra.broker_note import note_broker
    try:
        console.print(kafka_local.up(nodes=nodes, base_dir=dir, heap_mb=heap_mb))
        note_broker(dir)  # found from any folder (`crawlfleet crawl` elsewhere uses it)
    except CrawlfleetError as exc:
        _fail(exc)


@kafka_app.command("status", cls=_Command)
def kafka_status(dir: KafkaHomeOpt = None) -> None:
    """Show the local nodes and whether they run."""
    from infra import kafka_local
    st = kafka_local.status(dir)
    if not st.nodes:
        console.print("no local Kafka set up here")
        raise typer.Exit(1)
    for n in st.nodes:
        state = "running" if n.running else "stopped"
        pid = f" pid={n.pid}" if n.pid is not None else ""
        console.print(f"node {n.node_id}: {state}{pid} port={n.broker_port}")
    console.print(f"bootstrap: {st.bootstrap_servers}")
    if not st.running:
        raise typer.Exit(1)


@kafka_app.command("down", cls=_Command)
def kafka_down(dir: KafkaHomeOpt = None) -> None:
    """Stop the nodes `up` started (data and jars are kept)."""
    from infra import kafka_local
    try:
        kafka_local.down(dir)
    except CrawlfleetError as exc:
        _fail(exc)
    console.print("stopped")


# --- topics --------------------------------------------------------------------------------


@topics_app.command("create", cls=_Command)
def topics_create(config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
                  topic_prefix: PrefixOpt = None,
                  partitions: Annotated[int | None, typer.Option(help=setting_help(
                      "Partitions of each target-partitioned topic (automatic: 12).",
                      "partitions"))] = None,
                  replication: Annotated[int | None, typer.Option(help=setting_help(
                      "Replicas of each topic.", "replication"))] = None) -> None:
    """Create every crawl topic that does not exist yet (idempotent)."""
    from infra.topics import create_topics
    try:
        s = _on_cluster(_settings(config, bootstrap=bootstrap, topic_prefix=topic_prefix,
                                  partitions=partitions, replication=replication))
        for name, state in sorted(create_topics(s).items()):
            console.print(f"{state:8} {name}")
    except CrawlfleetError as exc:
        _fail(exc)


# --- publish -------------------------------------------------------------------------------


@command("publish")
def publish_cmd(source: Annotated[str | None, typer.Argument(
                    metavar="[SOURCE]", help="File of URLs / JSON lines, or - for stdin.")
                    ] = None,
                config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
                topic_prefix: PrefixOpt = None,
                profile: Annotated[str | None, typer.Option(
                    "--profile", help="Pin every line that names no profile to this one. "
                    "[default: none; such lines are unpinned, starting at the default "
                    "profile, env CRAWLFLEET_DEFAULT_PROFILE]")
                ] = None,
                sitemap: Annotated[list[str] | None, typer.Option(
                    "--sitemap", metavar="URL", help="Publish this sitemap (or index, .xml.gz, "
                    "text sitemap): the parse stage publishes the URLs it lists. Repeatable; "
                    "SOURCE lines then are sitemaps too. [default: none]")] = None) -> None:
    """Publish seeds to the frontier; bad lines are reported, good ones still go through."""
    from core.profiles import valid_name
    from producers.frontier import TopicsMissingError, publish
    if profile is not None and not valid_name(profile):
        _error(f"--profile {profile!r} is not a profile name (letters, digits, '.', '_', '-')")
        raise typer.Exit(2)
    if source is None and not sitemap:
        _error("publish needs a SOURCE (a file of URLs, or - for stdin) or --sitemap URL")
        raise typer.Exit(2)
    kind = "sitemap" if sitemap else "page"
    try:
        s = _on_cluster(_settings(config, bootstrap=bootstrap, topic_prefix=topic_prefix))
        if source is None:
            report = publish(sitemap or [], s, profile, kind=kind)
        elif source == "-":
            report = publish(itertools.chain(sitemap or [], sys.stdin), s, profile, kind=kind)
        else:
            with open(source, encoding="utf-8", errors="replace") as fh:
                report = publish(itertools.chain(sitemap or [], fh), s, profile, kind=kind)
    except OSError as exc:
        _error(f"cannot read {source}: {exc}")
        raise typer.Exit(2) from exc
    except TopicsMissingError as exc:
        _print_bad_lines(exc.report)
        _fail(exc)
        return
    except CrawlfleetError as exc:
        _fail(exc)
        return
    _print_bad_lines(report)
    warning = report.profile_warning()
    if warning:
        err_console.print(f"warning: {warning}", markup=False, highlight=False)
    console.print(f"published {report.published}, duplicates dropped {report.duplicates}, "
                  f"bad lines {len(report.errors)}")
    if report.errors:
        raise typer.Exit(1 if not report.published else EXIT_BAD_LINES)


def _print_bad_lines(report: Any) -> None:
    for line, reason in report.errors:
        err_console.print(f"line {line}: {reason}", markup=False, highlight=False)


# --- workers -------------------------------------------------------------------------------


@command("worker")
def worker_cmd(stage: Annotated[str, typer.Argument(
                   metavar="STAGE",
                   help="fetch | parse | store | retry | quarantine (the faust app that "
                        "counts blocks), or a stage of stage_modules")],
               config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
               clickhouse: ClickhouseOpt = None, data_dir: DataDirOpt = None,
               topic_prefix: PrefixOpt = None,
               worker_id: Annotated[str | None, typer.Option(
                   help="Stable id: a restarted worker with the same id fences its old self. "
                   "[default: the first free one of STAGE-0, STAGE-1, ... in the data dir]"
               )] = None,
               allow_private: Annotated[bool | None, typer.Option(
                   "--allow-private/--no-allow-private",
                   help=setting_help("Allow private/loopback/link-local targets.",
                                     "allow_private"))] = None,
               allow_hosts: AllowHostsOpt = None,
               rate_cap: RateCapOpt = None,
               metrics_port: Annotated[int | None, typer.Option(
                   help=setting_help("Serve Prometheus metrics on this port (0: any free one, "
                                     "logged and in the status file).", "metrics_port"))
               ] = None) -> None:
    """Run one stage worker until SIGTERM (then leave the group cleanly).

    A broker that does not answer yet, or a store held by someone else, is waited for
    (with back-off, saying so in the log and the worker's status), never a reason to exit.
    """
    from crawlfleet.worker_main import run_worker
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        s = _settings(config, bootstrap=bootstrap, clickhouse=clickhouse,
                      data_dir=data_dir, topic_prefix=topic_prefix,
                      allow_private=allow_private, allow_hosts=allow_hosts,
                      rate_cap=rate_cap, metrics_port=metrics_port)
        run_worker(stage, s, worker_id)
    except CrawlfleetError as exc:
        _fail(exc)


# --- crawl ---------------------------------------------------------------------------------


@command("crawl")
def crawl_cmd(seeds: Annotated[str, typer.Argument(
                  metavar="SEEDS", help="File of seed URLs / JSON lines, or - for stdin.")],
              config: ConfigOpt = None, bootstrap: BootstrapOpt = None,
              clickhouse: ClickhouseOpt = None, data_dir: DataDirOpt = None,
              topic_prefix: Annotated[str | None, typer.Option(
                  "--topic-prefix", help=setting_help(
                      "Namespace of topics and groups: give it to resume a crawl.",
                      "topic_prefix", "a fresh one per crawl"))] = None,
              allow_private: Annotated[bool, typer.Option(
                  "--allow-private", help=setting_help(
                      "Allow private/loopback targets (demo, tests).", "allow_private"))
              ] = False,
              allow_hosts: AllowHostsOpt = None,
              rate_cap: RateCapOpt = None,
              max_depth: Annotated[int | None, typer.Option(help=setting_help(
                  "Link depth limit (0: the seeds only).", "max_depth"))] = None,
              scope: Annotated[str | None, typer.Option(help=setting_help(
                  "same-target, seeds (the seeds' targets) or any.", "scope"))] = None,
              fetch_workers: Annotated[int, typer.Option(help="Fetch worker processes.")] = 1,
              parse_workers: Annotated[int, typer.Option(help="Parse worker processes.")] = 1,
              timeout: Annotated[float | None, typer.Option(
                  help="Give up after this many seconds. [default: never]")] = None,
              keep_topics: Annotated[bool, typer.Option(
                  "--keep-topics", help="Keep this run's own Kafka topics after it drained "
                  "(they are deleted when no --topic-prefix is given). [default: off]")
              ] = False,
              summary_json: Annotated[Path | None, typer.Option(
                  help="Also write the summary as JSON here. [default: none]")] = None,
              warc: Annotated[Path | None, typer.Option(
                  "--warc", metavar="DIR", help=setting_help(
                      "Also archive every stored page as WARC files in DIR.", "warc_dir",
                      "none"))] = None
              ) -> None:
    """Crawl from SEEDS with every stage as its own process; stop when drained.

    The crawl's name (its topic prefix) and the command that resumes it are printed at the
    start. Ctrl-C or SIGTERM stops it cleanly: a summary marked interrupted, its topics kept,
    and the resume command again. Exit status: 0 drained; 1 timed out (--timeout); 2 a usage
    or setup error; 3 drained, but some seed lines were bad; 4 drained, but nothing could be
    fetched (every seed refused: robots, address, scope); 130 interrupted (SIGINT), 143
    interrupted (SIGTERM)."""
    from crawlfleet import crawl
    from crawlfleet.crawls import store_place
    from crawlfleet.fleet import Plan
    given = {"--config": config, "--bootstrap": bootstrap, "--clickhouse": clickhouse,
             "--data-dir": data_dir, "--allow-hosts": allow_hosts, "--rate-cap": rate_cap,
             "--max-depth": max_depth, "--scope": scope,
             "--fetch-workers": fetch_workers if fetch_workers != 1 else None,
             "--parse-workers": parse_workers if parse_workers != 1 else None}
    flags = ["--allow-private"] if allow_private else []
    resume: list[str] = []

    def announce(s: Any) -> None:
        resume.append(resume_command(seeds, s.topic_prefix, given, flags))
        err_console.print(f"crawl {s.topic_prefix} started (store: {store_place(s)})",
                          markup=False, highlight=False)
        err_console.print(f"stop it with Ctrl-C; resume it with: {resume[0]}", markup=False,
                          highlight=False)

    signalled: list[int] = []

    def on_term(signum: int, _frame: Any) -> None:
        signalled.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        s = _settings(config, bootstrap=bootstrap, clickhouse=clickhouse, data_dir=data_dir,
                      topic_prefix=topic_prefix, allow_private=allow_private or None,
                      allow_hosts=allow_hosts, rate_cap=rate_cap, max_depth=max_depth,
                      scope=scope, warc_dir=str(warc.resolve()) if warc else None)
        plan = Plan(fetch_workers=fetch_workers, parse_workers=parse_workers)
        lines = sys.stdin.readlines() if seeds == "-" else \
            Path(seeds).read_text(encoding="utf-8", errors="replace").splitlines()
        summary = crawl.run_crawl(s, lines, plan, console=err_console, timeout_s=timeout,
                                  keep_topics=keep_topics, on_start=announce)
    except OSError as exc:
        _error(str(exc))
        raise typer.Exit(2) from exc
    except CrawlfleetError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:  # before the crawl began (or a second Ctrl-C): no summary
        err_console.print("interrupted" + (f"; resume with: {resume[0]}" if resume else ""),
                          markup=False, highlight=False)
        raise typer.Exit(EXIT_SIGNAL + (signalled[0] if signalled else signal.SIGINT)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    crawl.print_summary(summary, console)
    if summary_json:
        crawl.summary_json(summary, summary_json)
    raise typer.Exit(crawl_exit(summary, signalled[0] if signalled else signal.SIGINT,
                                resume[0] if resume else ""))


#: Exit status of a crawl that drained but stored no page: every seed was refused.
EXIT_NOTHING_FETCHED = 4
#: An interrupted crawl exits 128 + the signal's number, as a shell reports it.
EXIT_SIGNAL = 128


def crawl_exit(summary: Any, signum: int, resume: str) -> int:
    """The exit status of a finished ``crawl`` (see its help), saying what it means."""
    if summary.interrupted:
        err_console.print(f"interrupted: resume with: {resume}", markup=False,
                          highlight=False)
        return EXIT_SIGNAL + signum
    if not summary.drained:
        return 1
    if not summary.pages_stored:
        named = f" --crawl {summary.topic_prefix}" if summary.topic_prefix else ""
        err_console.print("nothing could be fetched: every seed was refused (see the dead "
                          f"letters above: `crawlfleet dlq list{named}`)", markup=False,
                          highlight=False)
        return EXIT_NOTHING_FETCHED
    return EXIT_BAD_LINES if summary.seed_errors else 0


def resume_command(seeds: str, prefix: str, given: dict[str, Any], flags: list[str]) -> str:
    """The command line that resumes a crawl: its options as given, and its prefix (its
    seeds again: already-seen pages are dropped by their dedupe keys)."""
    words = ["crawlfleet", "crawl", seeds, "--topic-prefix", prefix]
    for option, value in given.items():
        if value is not None:
            words += [option, str(value)]
    return shlex.join(words + flags)


# --- demo ----------------------------------------------------------------------------------


@command("demo-site")
def demo_site_cmd(port: Annotated[int, typer.Option(
                      help="First loopback port of the demo's hosts.")] = 18080,
                  seeds_file: Annotated[Path | None, typer.Option(
                      help="Write the seed URLs here. [default: none]")] = None) -> None:
    """Serve the small multi-host demo site on loopback until interrupted."""
    from sites.demo_pages import demo_spec
    from sites.demo_site import serve_forever
    spec = demo_spec(port)
    if seeds_file:
        seeds_file.write_text("\n".join(spec.seeds()) + "\n")
    console.print("serving " + ", ".join(spec.seeds()))
    serve_forever(spec)


@command("demo")
def demo_cmd(port: Annotated[int, typer.Option(
                 help="First loopback port of the demo's hosts.")] = 18080,
             data_dir: DataDirOpt = None,
             rate_cap: Annotated[float, typer.Option(
                 help="Requests per second per demo host (the demo's own pace: the "
                 "crawler's default is 2.0).")] = 5.0) -> None:
    """Serve the demo site, crawl it end to end, and show what was stored."""
    from crawlfleet import crawl
    from crawlfleet.fleet import Plan
    from infra.store_query import run_query
    from sites.demo_pages import demo_spec
    from sites.demo_server import DemoSite
    spec = demo_spec(port)
    try:
        s = _settings(None, data_dir=data_dir, allow_private=True, rate_cap=rate_cap)
        with DemoSite(spec) as site:
            summary = crawl.run_crawl(s, spec.seeds(), Plan(), console=err_console,
                                      timeout_s=600)
            crawl.print_summary(summary, console)
            console.print(f"the demo site answered {site.hits()} requests")
        cols, rows = run_query(s, "SELECT target, status, count() AS pages FROM pages_v "
                                  "GROUP BY target, status ORDER BY target, status")
    except CrawlfleetError as exc:
        _fail(exc)
        return
    t = Table(*cols, title="pages by target and status (SELECT ... FROM pages_v)")
    for r in rows:
        t.add_row(*(cell(v) for v in r))
    console.print(t)
    hint = 'crawlfleet sql "SELECT url, title FROM pages_v LIMIT 10"'
    console.print(f"query more with: {hint}" + (f" --data-dir {data_dir}" if data_dir else ""))
    console.print("see it in a browser: crawlfleet dashboard"
                  + (f" --data-dir {data_dir}" if data_dir else "")
                  + "  (prints its URL, http://127.0.0.1:8765/?token=...)", markup=False,
                  highlight=False)
    if not summary.drained:
        raise typer.Exit(1)


# The operator commands register themselves on ``app`` when imported (after these, so the
# help lists the everyday commands first).
from crawlfleet import cli_crawls, cli_dashboard, cli_ops  # noqa: E402,F401


def main() -> None:
    app()


if __name__ == "__main__":
    app()
