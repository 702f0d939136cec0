"""Configuration as one frozen, validated object.

Settings come from, in rising precedence: defaults, a TOML file (``--config`` or
``CRAWLFLEET_CONFIG``), ``CRAWLFLEET_*`` environment variables, and explicit overrides
(CLI flags). Every field is validated once, here, so stages never re-check them.
Secrets are kept in :class:`Secret`, whose repr never shows the value.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import logging
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, get_type_hints

from core import __version__
from core.errors import ConfigError
from core.profiles import (
    DIRECT,
    Egress,
    Profile,
    parse_egress,
    parse_profiles,
    product_token,
    tables_of,
)
from core.revisits import RevisitPolicies
from core.windows import parse_windows

ENV_PREFIX = "CRAWLFLEET_"
#: Partitions of shared (long-lived) topics: room for a fleet of up to 12 workers per stage.
DEFAULT_PARTITIONS = 12
DEFAULT_USER_AGENT = (f"crawlfleet/{__version__} "
                      "(+https://github.com/crawlfleet/crawlfleet; polite bot)")


class Secret:
    """A string that never appears in logs, reprs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')" if self._value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


#: Where this process's Kafka clients send librdkafka's own log lines; None leaves them on
#: stderr (a worker's stderr is its log file). See :func:`route_kafka_logs`.
_kafka_logger: logging.Logger | None = None


def route_kafka_logs(logger: logging.Logger | None) -> None:
    """Send librdkafka's log lines of every client made from now on to ``logger``.

    The CLI's one-shot commands do, so a broker that does not answer never floods the
    terminal with connection-refused lines; the command says so itself, once.
    """
    global _kafka_logger
    _kafka_logger = logger


#: The longest one retry waits (a site's Retry-After is capped to it).
MAX_RETRY_DELAY_S = 3600.0


@dataclass(frozen=True)
class Settings:
    """Every knob of a crawlfleet process. Env var: ``CRAWLFLEET_<FIELD NAME UPPERCASE>``."""

    #: Kafka bootstrap servers; empty means "use (or start) the local broker".
    bootstrap_servers: str = ""
    #: ClickHouse DSN (``http://user:pw@host:8123/db``); empty means embedded chDB under data_dir.
    clickhouse_dsn: Secret = field(default_factory=lambda: Secret(""))
    #: ClickHouse cluster of the DSN (its schema: ``crawlfleet schema --cluster NAME --apply``).
    clickhouse_cluster: str = ""
    #: Longest one ClickHouse server request (and quorum wait) before ``store_waiting``.
    clickhouse_timeout_s: float = 30.0
    #: Root of local state: Kafka jars/data, chDB store, worker status files.
    data_dir: Path = Path(".crawlfleet")
    #: Extra librdkafka settings for every client, e.g. ``security.protocol``.
    kafka_security_protocol: str = ""
    kafka_sasl_mechanism: str = ""
    kafka_sasl_username: str = ""
    kafka_sasl_password: Secret = field(default_factory=lambda: Secret(""))
    #: Honest User-Agent sent with every request and matched against robots.txt.
    user_agent: str = DEFAULT_USER_AGENT
    #: The robots.txt token we obey (the product token of the User-Agent).
    robots_agent: str = "crawlfleet"
    #: Politeness unit: ``host`` or ``domain`` (registrable domain, approximated).
    target_mode: str = "host"
    #: Crawl identity used when a job names none.
    default_profile: str = "default"
    #: Crawl identities by name (TOML ``[profiles.NAME]`` tables, or JSON in
    #: ``CRAWLFLEET_PROFILES``): see :mod:`core.profiles`. Empty: one profile,
    #: ``default_profile``, from ``user_agent``, ``robots_agent`` and ``profile_bundle_version``.
    profiles: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Forward proxies by name (``[egress.NAME]``: ``proxy`` URL, ``region``); ``direct`` is
    #: built in. Proxy passwords are never logged or listed.
    egress: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Region of this machine's own way out (the built-in ``direct`` egress).
    region: str = "local"
    #: Prefix for every topic and consumer-group name (isolates crawls and tests).
    topic_prefix: str = ""
    #: Partition count of every target-partitioned topic (they must match to co-partition).
    #: 0 = automatic: ``DEFAULT_PARTITIONS`` for shared topics (``topics create``, workers,
    #: ``publish``); a one-off ``crawl`` sizes its own topics to the processes it starts,
    #: and a resumed one adopts its existing topics' count.
    partitions: int = 0
    replication: int = 1
    #: Default per-target request rate cap (requests per second).
    rate_cap: float = 2.0
    #: Fleet-wide cap on requests per second across all targets (0 = none), split evenly
    #: among the live fetch workers.
    fleet_rate_cap: float = 0.0
    #: Per-target overrides of the cap: {target: requests per second}.
    rate_caps: dict[str, float] = field(default_factory=dict)
    #: Per-target crawl windows in the target's time zone, e.g.
    #: {"example.org": "Europe/Paris mon-fri 09:00-17:00"}; outside them jobs wait.
    crawl_windows: dict[str, str] = field(default_factory=dict)
    #: When a stored page is visited again (core/revisits.py): ``once`` (never), ``every
    #: 6h`` or ``adaptive 10m..7d``; ``revisits`` overrides it per target pattern, e.g.
    #: {"news.example.org": "adaptive 15m..1d", "*.example.org": "every 1d"}.
    revisit: str = "once"
    revisits: dict[str, str] = field(default_factory=dict)
    #: Extra CA certificates (a PEM file) a fetch trusts besides the system's: a private
    #: CA of your own sites, a test CA. Empty: the system's trust store only.
    tls_ca_file: str = ""
    #: Requests in flight per fetch worker, across all targets.
    max_inflight: int = 256
    #: Finished results a fetch worker may hold before their transaction commits (plus what
    #: is in flight). A commit that stalls (a slow or restarted broker) stops new requests
    #: here, so a worker killed meanwhile makes its successor repeat at most this many.
    max_uncommitted: int = 2048
    #: A commit that has not returned after this many seconds holds new requests until it
    #: does (or the worker restarts): what is fetched meanwhile may have to be fetched again.
    commit_stall_s: float = 5.0
    #: Jobs held in memory per fetch worker before its partitions are paused.
    max_buffered: int = 5000
    #: Requests in flight to one target at most (halved on errors, regained on successes).
    max_inflight_per_target: int = 8
    #: A target's share of a worker's memory: this many seconds of work at the target's
    #: current rate, plus ``target_buffer_floor`` jobs (at most half of ``max_buffered``).
    #: Work beyond its share is parked on disk (``crawl.parked``) and comes back in order.
    target_buffer_s: float = 5.0
    target_buffer_floor: int = 8
    #: Targets a fetch worker keeps state for (scheduler slot, Crawl-delay, robots.txt
    #: rules, adaptive health): beyond this the longest-idle ones are forgotten (only those
    #: with no work and whose next request is allowed anyway; a degraded one's health is
    #: kept aside, within the same bound; a new target's job waits on disk while none can
    #: go), so a site minting host names cannot grow a worker without bound.
    max_target_state: int = 10_000
    #: A target idle this long is forgotten whatever the count (a degraded one too).
    target_idle_s: float = 600.0
    #: Statuses that mean the site blocks us: outcome ``blocked``, the target slows down.
    block_statuses: tuple[int, ...] = (403,)
    #: Quarantine (the faust app ``crawlfleet worker quarantine``): this many distinct
    #: blocked attempts of one (target, profile) or (target, egress) within
    #: ``quarantine_window_s`` of each other retire it for ``quarantine_s``; when more than
    #: ``quarantine_target_share`` of the profiles allowed for a target are quarantined, the
    #: whole target is paused for ``quarantine_s`` instead of burning the rest.
    quarantine_blocks: int = 3
    quarantine_window_s: float = 600.0
    quarantine_s: float = 1800.0
    quarantine_target_share: float = 0.5
    #: Egress health (per fetch worker): ``egress_failures`` faults of an egress's own
    #: (connect, timeout, proxy error, 407) within ``egress_window_s``, on at least two
    #: targets, cool it off for ``egress_cooloff_s``. Blocks are the quarantine's, per target.
    egress_failures: int = 5
    egress_window_s: float = 60.0
    egress_cooloff_s: float = 60.0
    request_timeout_s: float = 20.0
    connect_timeout_s: float = 5.0
    max_response_bytes: int = 5 * 1024 * 1024
    max_redirects: int = 5
    #: Sitemaps (``kind`` sitemap jobs): a sitemap's bytes after every decompression, HTTP
    #: and gzip file alike (Crawlee's 50 MB; past it: dead letter ``sitemap_too_large``),
    #: how deep indexes may nest (0: the published or robots.txt-named sitemap; one listed
    #: deeper than ``sitemap_max_depth`` is dead-lettered ``sitemap_too_deep``, unfetched),
    #: and how many URLs of one target one sitemap may publish (the protocol's 50,000; the
    #: rest are dropped and counted).
    sitemap_max_bytes: int = 50 * 1024 * 1024
    sitemap_max_depth: int = 10
    sitemap_max_urls: int = 50_000
    #: The implicit default profile follows the ``Sitemap:`` lines of robots.txt (a
    #: configured profile says so itself: ``follow_sitemaps = true``).
    follow_sitemaps: bool = False
    #: Allow private, loopback and link-local addresses (tests and the demo only).
    allow_private: bool = False
    #: Non-public destinations allowed one by one (tests, private deployments): host
    #: names (any address they resolve to), IP addresses or CIDR networks.
    allow_hosts: tuple[str, ...] = ()
    #: Link scope: ``same-target`` (the page's own target), ``seeds`` (any of
    #: ``allowed_targets``, which ``crawl`` fills with the seeds' targets) or ``any``.
    scope: str = "same-target"
    allowed_targets: tuple[str, ...] = ()
    #: Modules that declare stages of your own (``schemas.topics.register_stage``), imported
    #: by every process that loads these settings, so each worker knows the whole pipeline.
    stage_modules: tuple[str, ...] = ()
    #: Maximum link depth from a seed (0 = seeds only); negative means unlimited.
    max_depth: int = -1
    #: Attempts before a retryable failure is dead-lettered.
    max_attempts: int = 3
    robots_ttl_s: float = 3600.0
    #: Retention of dedupe keys in ``crawl.seen``; must exceed retry horizon + lease.
    seen_ttl_s: float = 7 * 24 * 3600.0
    #: Consumer-group session timeout: the broker-judged lease of a worker. Workers are
    #: static members (their worker id is their ``group.instance.id``): one restarted within
    #: this time takes its partitions back with no rebalance, and one that stops for good
    #: holds its partitions this long before the others take them over.
    session_timeout_ms: int = 30_000
    #: A partition's state (dedupe keys, parked jobs, timers) restore gives up after this
    #: long; the partition then stays paused and its restore is retried, never used partial.
    restore_timeout_s: float = 120.0
    #: The store worker writes every stage's queue depth into ClickHouse (``queue_samples``)
    #: this often, in seconds; 0 turns the sampler off.
    sample_interval_s: float = 10.0
    max_poll_interval_ms: int = 300_000
    #: How often a busy fetch worker commits its transaction (an idle one commits at once).
    #: Each transaction costs a produce request per partition it touches plus the broker's
    #: verification of each, so under load fewer, fuller transactions save the broker CPU.
    commit_interval_s: float = 0.5
    #: Frontier records not yet fetched above which publishers block and link discovery
    #: pauses (0 = unbounded).
    frontier_lag_bound: int = 200_000
    #: Rows per ClickHouse insert batch (store stage), the longest wait to fill one, and how
    #: long a batch gathers while the input trickles (``streams.trickle``; 0 = not longer).
    store_batch_rows: int = 5000
    store_batch_wait_s: float = 0.25
    store_trickle_wait_s: float = 1.0
    #: WARC archive of the stored pages (``consumers.warc``), files finished past a size.
    warc_dir: str = ""
    warc_max_bytes: int = 1 << 30
    #: Port of the worker's Prometheus endpoint (``/metrics``): -1 = off, 0 = any free port
    #: (logged, and written to the worker's status file as ``metrics_port``).
    metrics_port: int = -1
    #: Address the metrics endpoint binds; loopback unless a scraper elsewhere needs it.
    metrics_bind: str = "127.0.0.1"
    #: Port of ``crawlfleet dashboard`` on 127.0.0.1 (0 = any free port, printed at start).
    dashboard_port: int = 8765
    #: Code revision of the version tuple (telemetry, pages, the approved set): empty =
    #: auto, the git commit the package runs from (``+dirty`` if tracked files differ),
    #: else the package version. Set it to name a build (tests play two versions so).
    code_revision: str = ""
    #: The profile bundle's version: the tuple's bundle field for the whole configured
    #: set of profiles (bump it when any profile changes).
    profile_bundle_version: str = "1"

    def __post_init__(self) -> None:
        problems = list(_problems(self))
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))
        egress = {DIRECT: Egress(DIRECT, self.region), **parse_egress(self.egress)}
        profiles = parse_profiles(self.profiles, egress) or {
            self.default_profile: Profile(
                name=self.default_profile, user_agent=self.user_agent,
                robots_token=self.robots_agent or product_token(self.user_agent),
                region=self.region, bundle_version=self.profile_bundle_version,
                follow_sitemaps=self.follow_sitemaps)}
        if self.default_profile not in profiles:
            raise ConfigError(f"invalid configuration: default_profile "
                              f"{self.default_profile!r} is not one of the profiles "
                              f"({', '.join(sorted(profiles))})")
        object.__setattr__(self, "_egress", egress)
        object.__setattr__(self, "_profiles", profiles)

    @property
    def profile_table(self) -> dict[str, Profile]:
        """Every profile by name (the implicit default one when none is configured)."""
        table: dict[str, Profile] = self._profiles  # type: ignore[attr-defined]
        return table

    @property
    def egress_table(self) -> dict[str, Egress]:
        """Every egress by name, ``direct`` included."""
        table: dict[str, Egress] = self._egress  # type: ignore[attr-defined]
        return table

    @property
    def topic_partitions(self) -> int:
        """The partition count in effect: the configured one, else the shared default."""
        return self.partitions or DEFAULT_PARTITIONS

    @property
    def clickhouse_path(self) -> Path:
        return self.data_dir / "clickhouse"

    @property
    def status_dir(self) -> Path:
        return self.data_dir / "status" / (self.topic_prefix.rstrip(".") or "default")

    @property
    def dedupe_horizon_s(self) -> float:
        """How long a job's dedupe key must live: the retry horizon plus the longest lease."""
        return self.retry_horizon_s + self.max_poll_interval_ms / 1000.0

    @property
    def retry_horizon_s(self) -> float:
        """Longest a job can spend waiting for retries before its last attempt: each retry
        waits its own delay in the retry stage's timer store, at most a capped Retry-After."""
        return float(self.max_attempts - 1) * MAX_RETRY_DELAY_S

    def cap_for(self, target: str) -> float:
        return self.rate_caps.get(target, self.rate_cap)

    def kafka_common(self) -> dict[str, Any]:
        """librdkafka settings shared by every client (security included)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        if _kafka_logger is not None:
            conf["logger"] = _kafka_logger
        if self.kafka_security_protocol:
            conf["security.protocol"] = self.kafka_security_protocol
        if self.kafka_sasl_mechanism:
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
            conf["sasl.username"] = self.kafka_sasl_username
            conf["sasl.password"] = self.kafka_sasl_password.get()
        return conf

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **{k: _coerce_field(k, v) for k, v in changes.items()})


#: Settings that hold secrets: never logged, and readable from a file
#: (``CRAWLFLEET_<NAME>_FILE``).
SECRET_FIELDS = frozenset({"clickhouse_dsn", "kafka_sasl_password"})

#: Every setting's default value, by field name (what ``--help`` shows for an option left out).
def _default_of(f: dataclasses.Field[Any]) -> Any:
    factory: Any = f.default_factory
    return f.default if factory is dataclasses.MISSING else factory()


SETTING_DEFAULTS: dict[str, Any] = {f.name: _default_of(f) for f in fields(Settings)}


def _problems(s: Settings) -> list[str]:
    out: list[str] = []
    if s.tls_ca_file and not Path(s.tls_ca_file).is_file():
        out.append(f"tls_ca_file {s.tls_ca_file!r} is not a file")
    if s.target_mode not in ("host", "domain"):
        out.append(f"target_mode must be 'host' or 'domain', not {s.target_mode!r}")
    if not re.fullmatch(r"[A-Za-z0-9_]*", s.clickhouse_cluster):
        out.append("clickhouse_cluster may only contain letters, digits and '_'")
    lease_share = 6000 * s.clickhouse_timeout_s / s.max_poll_interval_ms  # 6 inserts a lease
    if s.clickhouse_timeout_s <= 0 or (s.clickhouse_dsn.get() and lease_share >= 1):
        out.append("clickhouse_timeout_s must be > 0 and, with a server, < max_poll_interval / 6")
    if s.clickhouse_cluster and not s.clickhouse_dsn.get():
        out.append("clickhouse_cluster needs a ClickHouse server (clickhouse_dsn): the "
                   "embedded store is one process")
    if not re.fullmatch(r"[A-Za-z0-9._-]*", s.topic_prefix):
        out.append("topic_prefix may only contain letters, digits, '.', '_' and '-'")
    if s.scope not in ("same-target", "seeds", "any"):
        out.append(f"scope must be same-target, seeds or any, not {s.scope!r}")
    if s.partitions < 0:
        out.append("partitions must be >= 1 (or 0 = automatic)")
    for name in ("replication", "max_inflight", "max_buffered", "max_attempts",
                 "store_batch_rows", "max_inflight_per_target", "target_buffer_floor",
                 "max_target_state", "egress_failures", "max_uncommitted", "quarantine_blocks"):
        if getattr(s, name) < 1:
            out.append(f"{name} must be >= 1")
    for name in ("rate_cap", "request_timeout_s", "connect_timeout_s", "commit_interval_s",
                 "robots_ttl_s", "seen_ttl_s", "store_batch_wait_s", "target_buffer_s",
                 "restore_timeout_s", "target_idle_s", "egress_window_s",
                 "egress_cooloff_s", "commit_stall_s", "quarantine_window_s", "quarantine_s"):
        if getattr(s, name) <= 0:
            out.append(f"{name} must be > 0")
    for name in ("code_revision", "profile_bundle_version"):
        value = getattr(s, name)
        if re.search(r"[;=\x00-\x1f\x7f]", value) or value != value.strip():
            out.append(f"{name} may not contain ';', '=', control characters or surrounding "
                       "blanks (it is a field of the version tuple)")
    if not s.profile_bundle_version:
        out.append("profile_bundle_version must not be empty")
    if not 0 <= s.quarantine_target_share < 1:
        out.append("quarantine_target_share must be in [0, 1): the target pauses when more "
                   "than this share of its profiles is quarantined")
    for name, zero in (("sample_interval_s", "no queue sampling"), ("fleet_rate_cap", "no cap"),
                       ("frontier_lag_bound", "unbounded"), ("store_trickle_wait_s", "none")):
        if getattr(s, name) < 0:
            out.append(f"{name} must be >= 0 (0 = {zero})")
    for target, spec in s.crawl_windows.items():
        try:
            parse_windows(spec)
        except ConfigError as exc:
            out.append(f"crawl_windows[{target!r}]: {exc}")
    try:
        RevisitPolicies(s.revisit, s.revisits)
    except ConfigError as exc:
        out.append(f"revisit: {exc}")
    for target, cap in s.rate_caps.items():
        if cap <= 0:
            out.append(f"rate_caps[{target!r}] must be > 0")
    horizon = s.dedupe_horizon_s
    if s.seen_ttl_s <= horizon:
        out.append(f"seen_ttl_s ({s.seen_ttl_s:g}s) must exceed the retry horizon plus the "
                   f"longest lease ({horizon:g}s), or a retried job could be fetched twice")
    for name in ("max_response_bytes", "warc_max_bytes"):
        if getattr(s, name) < 1024:
            out.append(f"{name} must be >= 1024")
    if s.warc_dir and (s.max_response_bytes > 7 << 20 or Path(s.warc_dir).is_file()):
        out.append("warc_dir must be a directory, and max_response_bytes <= 7 MiB with it "
                   "(a page's text and kept body must fit crawl.parsed's 16 MiB records)")
    bad = [c for c in s.block_statuses if not 400 <= c <= 599]
    if bad:
        out.append(f"block_statuses must be 4xx/5xx statuses, not {bad}")
    if s.max_redirects < 0:
        out.append("max_redirects must be >= 0")
    if not 1024 <= s.sitemap_max_bytes <= 1 << 30:
        out.append("sitemap_max_bytes must be in [1024, 1 GiB]")
    if not 0 <= s.sitemap_max_depth <= 100:
        out.append("sitemap_max_depth must be in [0, 100] (0: no sitemap indexes)")
    if not 1 <= s.sitemap_max_urls <= 10_000_000:
        out.append("sitemap_max_urls must be in [1, 10,000,000]")
    for module in s.stage_modules:
        if not _MODULE_RE.fullmatch(module):
            out.append(f"stage_modules entry {module!r} is not a dotted module name")
    for entry in s.allow_hosts:
        if not _host_or_network(entry):
            out.append(f"allow_hosts entry {entry!r} is not a host name, IP address or "
                       "CIDR network")
    if not -1 <= s.metrics_port <= 65535:
        out.append("metrics_port must be -1 (off), 0 (any free port) or a port number")
    if not s.metrics_bind.strip():
        out.append("metrics_bind must not be empty")
    if not 0 <= s.dashboard_port <= 65535:
        out.append("dashboard_port must be 0 (any free port) or a port number")
    if not s.user_agent.strip():
        out.append("user_agent must not be empty")
    return out


_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def load_stage_modules(s: Settings) -> None:
    """Import the modules that declare the user's own stages (``stage_modules``)."""
    import importlib
    for module in s.stage_modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any failure of user code is a config error
            raise ConfigError(f"stage_modules: cannot import {module!r}: "
                              f"{type(exc).__name__}: {exc}") from exc


def _host_or_network(entry: str) -> bool:
    """An IP address, a CIDR network or a host name (LDH labels)."""
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?\.?",
                            entry) is not None and ":" not in entry and "/" not in entry
    return True


#: Settings that are tables of tables (TOML), or JSON text in their environment variable.
TABLE_FIELDS = frozenset({"profiles", "egress"})

#: ``CRAWLFLEET_*`` names that are no settings (tools, chaos, build, tests): a worker accepts them.
RESERVED_ENV = frozenset({"CONFIG", "FAULT", "FAULT_STALL_S", "HOME", "KAFKA_JARS", "KAFKA_PORT", "CLOCK_SKEW_S", "ROLL_RESULTS", "BUILD_REVISION", "CURRENT_TEST"})  # noqa: E501


@lru_cache(maxsize=1)
def _settings_hints() -> dict[str, Any]:
    """Settings' field types, resolved once (each resolution evaluates every annotation)."""
    return get_type_hints(Settings)


def _coerce_field(name: str, value: Any, source: str | None = None) -> Any:
    hints = _settings_hints()
    if name not in hints:
        raise ConfigError(f"unknown setting {name!r}")
    if name in TABLE_FIELDS:
        return tables_of(value, name)
    return _coerce(name, hints[name], value, source)


def _expected(hint: Any) -> str:
    """What a value of type ``hint`` looks like, for error messages."""
    origin = getattr(hint, "__origin__", None)
    simple = {bool: "true or false (also 1/0, yes/no, on/off)", int: "a whole number, e.g. 8",
              float: "a number, e.g. 2.5"}
    if hint in simple:
        return str(simple[hint])
    if origin is tuple:
        return "a comma-separated list, e.g. a,b"
    if origin is dict:
        if hint.__args__[1] is str:
            return "TARGET=VALUE pairs separated by '|'"
        return "TARGET=NUMBER pairs separated by ',', e.g. example.com=0.5,other.org=2"
    return "a string"


def _coerce(name: str, hint: Any, value: Any, source: str | None = None) -> Any:
    try:
        if hint is Secret:
            return value if isinstance(value, Secret) else Secret(str(value))
        if hint is Path:
            return Path(value)
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off", ""):
                    return False
                raise ValueError(value)
            return bool(value)
        if hint is int:
            return int(value)
        if hint is float:
            return float(value)
        if hint is str:
            return str(value)
        if getattr(hint, "__origin__", None) is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            conv = hint.__args__[0]
            return tuple(conv(str(i).strip()) for i in items if str(i).strip())
        if getattr(hint, "__origin__", None) is dict:
            conv = hint.__args__[1]
            if isinstance(value, str):  # env form: "a=1,b=2" (windows: "a=TZ 09:00-17:00|b=...")
                sep = "|" if conv is str else ","
                return {k.strip(): conv(v.strip()) for k, v in
                        (item.split("=", 1) for item in value.split(sep) if item.strip())}
            return {str(k): conv(v) for k, v in dict(value).items()}
    except (TypeError, ValueError) as exc:
        where = source or f"setting {name!r}"
        raise ConfigError(f"{where}={value!r} is not valid for setting {name!r}: expected "
                          f"{_expected(hint)}") from exc
    raise ConfigError(f"setting {name!r}: unsupported type {hint}")


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from file, then ``CRAWLFLEET_*`` env, then non-None overrides."""
    values: dict[str, Any] = {}
    path = config_file or (Path(os.environ[ENV_PREFIX + "CONFIG"])
                           if os.environ.get(ENV_PREFIX + "CONFIG") else None)
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    names = {f.name for f in fields(Settings)}
    sources = {k: f"{path}: {k}" for k in values}
    unknown_env: list[str] = []
    for key, env in os.environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):]
        if name.lower() in names and name == name.upper():
            values[name.lower()] = env
            sources[name.lower()] = key
        elif name.endswith("_FILE") and name[:-5].lower() in SECRET_FIELDS \
                and name == name.upper():
            # A secret from a file (Docker and Kubernetes secrets): CRAWLFLEET_<NAME>_FILE.
            try:
                values[name[:-5].lower()] = Path(env).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"{key}: cannot read {env}: {exc.strerror}") from exc
            sources[name[:-5].lower()] = key
        elif name not in RESERVED_ENV:
            unknown_env.append(key)
    if unknown_env:
        raise ConfigError("unknown environment variable(s): " + "; ".join(
            _suggest(k, [ENV_PREFIX + n.upper() for n in names]) for k in sorted(unknown_env)))
    for k, v in overrides.items():
        if v is not None:
            values[k] = v
            sources[k] = f"--{k.replace('_', '-')}"
    unknown = set(values) - names
    if unknown:
        raise ConfigError("unknown setting(s): " + "; ".join(
            _suggest(k, sorted(names)) for k in sorted(unknown)))
    settings = Settings(**{k: _coerce_field(k, v, sources.get(k)) for k, v in values.items()})
    load_stage_modules(settings)
    return settings


def _suggest(name: str, known: list[str]) -> str:
    """``name``, with the closest known name if one is close (a typo)."""
    close = difflib.get_close_matches(name, known, n=1)
    return f"{name} (did you mean {close[0]}?)" if close else name
