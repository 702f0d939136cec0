"""What every ``crawlfleet`` command shares: the app and its sub-apps, consoles, common
options, settings loading and error output."""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from core.config import (
    ENV_PREFIX,
    SETTING_DEFAULTS,
    Settings,
    load_settings,
    route_kafka_logs,
)
from core.errors import CrawlfleetError


class _Command(TyperCommand):
    """Usage lines as a newcomer reads them: ``crawl [OPTIONS] SEEDS``, not ``{seeds}``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            # An option whose help states its default ("[default: ...; env ...]") gets no
            # second one from typer ("[default: 0, no soak] [default: 0.0]").
            if "[default:" in (getattr(param, "help", None) or ""):
                param.show_default = False  # type: ignore[attr-defined]
            if param.nargs == -1:  # "TUPLE...", not "TUPLE <list[str]>": no Python types
                param.display_type = lambda ctx: ""  # type: ignore[attr-defined]

    def collect_usage_pieces(self, ctx: Any) -> list[str]:  # typer's own click Context
        return [p.strip("{}") for p in super().collect_usage_pieces(ctx)]

    def get_short_help_str(self, limit: int = 45) -> str:
        """The command list shows each command's whole first sentence, never "...": a
        description cut short says less than none."""
        return super().get_short_help_str(limit=max(limit, 300))


def _typer(help: str) -> typer.Typer:
    # Plain help (no rich markup): "[default: ...]" survives, flags show no "<bool>" type.
    return typer.Typer(help=help, no_args_is_help=True, pretty_exceptions_enable=False,
                       rich_markup_mode=None, cls=TyperGroup)


app = _typer("crawlfleet: a polite, fault-tolerant, distributed crawler on Kafka.")
kafka_app = _typer("Run a local Apache Kafka (KRaft) from Maven Central jars.")
topics_app = _typer("Provision the crawl topics.")
dlq_app = _typer("Dead letters: list, show, replay.")
app.add_typer(kafka_app, name="kafka")
app.add_typer(topics_app, name="topics")
app.add_typer(dlq_app, name="dlq")
command = partial(app.command, cls=_Command)
#: Piped output is plain and complete: no terminal width to cut tables to, no live redraws.
console = Console() if sys.stdout.isatty() else Console(width=100_000, soft_wrap=True)
err_console = Console(stderr=True) if sys.stderr.isatty() else \
    Console(stderr=True, width=100_000, soft_wrap=True)
#: Exit status when some input lines were rejected (the good ones still went through).
EXIT_BAD_LINES = 3
#: How an option backed by a setting shows that setting's default, where it is not the value.
_SHOWN_DEFAULTS = {
    "bootstrap_servers": "the local broker (`crawlfleet kafka up`)",
    "clickhouse_dsn": "the embedded chDB store under the data dir",
    "topic_prefix": "none",
    "allow_private": "off", "allow_hosts": "none", "max_depth": "unlimited",
    "metrics_port": "off", "partitions": "automatic",
}


def setting_help(text: str, name: str, shown: str | None = None) -> str:
    """``text`` plus the default and the environment variable of setting ``name``: an option
    left out takes the setting's value (config file, then ``CRAWLFLEET_*``, then default)."""
    default = shown or _SHOWN_DEFAULTS.get(name) or str(SETTING_DEFAULTS[name])
    return f"{text} [default: {default}; env {ENV_PREFIX}{name.upper()}]"


ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="TOML settings file. [default: none; env CRAWLFLEET_CONFIG]")]
BootstrapOpt = Annotated[str | None, typer.Option(
    "--bootstrap", help=setting_help("Kafka bootstrap servers.", "bootstrap_servers"))]
ClickhouseOpt = Annotated[str | None, typer.Option(
    "--clickhouse", help=setting_help("ClickHouse DSN.", "clickhouse_dsn"))]
DataDirOpt = Annotated[Path | None, typer.Option(
    "--data-dir", help=setting_help("Local state: chDB store, logs, status.", "data_dir"))]
PrefixOpt = Annotated[str | None, typer.Option(
    "--topic-prefix", help=setting_help("Namespace of topics and groups.", "topic_prefix"))]
CrawlOpt = Annotated[str | None, typer.Option(
    "--topic-prefix", "--crawl", metavar="NAME", help="The crawl to act on: its topic prefix "
    "or name (`crawlfleet crawls` lists them). [default: the configured prefix (env "
    "CRAWLFLEET_TOPIC_PREFIX), else the crawl running on the data dir, else the shared "
    "namespace]")]
TargetOpt = Annotated[str | None, typer.Option(
    "--target", help="Only this target (host). [default: every target]")]
KafkaHomeOpt = Annotated[Path | None, typer.Option(
    help="Kafka home (jars, data). [default: .crawlfleet/kafka, or "
    "$CRAWLFLEET_HOME/kafka]")]
RateCapOpt = Annotated[float | None, typer.Option(
    help=setting_help("Requests per second per target.", "rate_cap"))]
AllowHostsOpt = Annotated[str | None, typer.Option(
    "--allow-hosts", help=setting_help(
        "Comma-separated hosts, IPs or CIDR networks that may be private (e.g. "
        "127.0.0.1/32,intranet.local); everything else must be public.", "allow_hosts"))]


#: Commands that run for good and log to their own stderr (a worker's log file): librdkafka's
#: lines stay there. Every other command routes them to the ``crawlfleet.kafka`` logger.
_LOGGING_COMMANDS = frozenset({"worker"})


def _show_version(asked: bool) -> None:
    if not asked:
        return
    from core import __version__
    from core.versions import HTTP_LIB_VERSION, TLS_LIB_VERSION, detected_revision
    console.print(f"crawlfleet {__version__} (code {detected_revision()}; "
                  f"{HTTP_LIB_VERSION}; {TLS_LIB_VERSION})", markup=False, highlight=False)
    raise typer.Exit()


@app.callback()
def _main(ctx: typer.Context, verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Show log lines, librdkafka's (logger crawlfleet.kafka) "
        "included. [default: off]")] = False,
          version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_show_version,
        help="Show the version and the code revision (the build's commit) and exit.")]
          = False) -> None:
    """crawlfleet: a polite, fault-tolerant, distributed crawler on Kafka."""
    if ctx.invoked_subcommand in _LOGGING_COMMANDS:
        return
    kafka_log = logging.getLogger("crawlfleet.kafka")
    if verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
        kafka_log.propagate = True
    else:
        kafka_log.addHandler(logging.NullHandler())
        kafka_log.propagate = False
    route_kafka_logs(kafka_log)


def _settings(config: Path | None, **overrides: Any) -> Settings:
    if overrides.get("clickhouse") is not None:
        overrides["clickhouse_dsn"] = overrides.pop("clickhouse")
    overrides.pop("clickhouse", None)
    if overrides.get("bootstrap") is not None:
        overrides["bootstrap_servers"] = overrides.pop("bootstrap")
    overrides.pop("bootstrap", None)
    return load_settings(config, **overrides)


def _on_cluster(s: Settings) -> Settings:
    """``s`` for commands that use an existing cluster and its topics as they are."""
    from crawlfleet.reach import reach_kafka
    from infra.topics import adopt_partitions
    return adopt_partitions(reach_kafka(s))


def crawl_settings(config: Path | None, bootstrap: str | None, topic_prefix: str | None,
                   data_dir: Path | None = None, **overrides: Any) -> Settings:
    """Settings on the crawl an operator command means, once its broker answered: the
    ``--topic-prefix`` (or crawl name) given, else the crawl running on the data dir, else
    the shared namespace; one whose topics do not exist is an error at once, naming the fix
    (:mod:`crawlfleet.crawls`)."""
    from crawlfleet.crawls import pick_namespace, require_namespace
    from crawlfleet.reach import reach_kafka
    s = reach_kafka(_settings(config, bootstrap=bootstrap, data_dir=data_dir, **overrides))
    return require_namespace(pick_namespace(s, topic_prefix))


def store_crawl_settings(config: Path | None, topic_prefix: str | None,
                         clickhouse: str | None, data_dir: Path | None) -> Settings:
    """Settings on the crawl a command that only reads the store means, found as
    :func:`crawl_settings` finds it, yet with no broker asked: a one-off crawl removes its
    topics when it ends, its rows (pages, dead letters) stay in the store."""
    from crawlfleet.crawls import pick_namespace
    return pick_namespace(_settings(config, clickhouse=clickhouse, data_dir=data_dir),
                          topic_prefix)


def crawl_name(s: Settings) -> str:
    """How a command's output names the crawl it acted on."""
    return f"crawl {s.topic_prefix}" if s.topic_prefix else "the shared fleet"


def _error(text: str) -> None:
    """``error: text`` on stderr; ``text`` is printed as it is (never parsed as markup)."""
    err_console.print(Text.assemble(("error:", "red"), " ", text))


def _fail(exc: CrawlfleetError) -> None:
    _error(str(exc))
    raise typer.Exit(2)


def cell(value: Any) -> Text:
    """A table cell of data (a URL, a title, an engine's message): plain text, so a crawled
    ``[/]`` or ``[link=...]`` is shown as written, never run as markup."""
    return Text(str(value))
