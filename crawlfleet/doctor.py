"""``crawlfleet doctor``: settings that guarantee duplicate work or defeat themselves.

The checks are pure functions of the settings and the fetch durations the store measured
(``fetch_events.elapsed_ms``, p50/p95/p99 over a window); :func:`diagnose` gathers both.
A ``FAIL`` is a setting that makes work be done twice (or not at all) whenever its
condition arises; a ``warn`` one that wastes or caps the crawl; each names its fix.
The lease (``max.poll.interval.ms``) is checked against the longest gap between two polls
each live worker measured (its ``poll_gap_ms`` gauge), not against fetch durations: fetch
requests run beside the polls, and the session is kept by librdkafka's heartbeat thread.

It also says what holds the fleet still right now, from the workers' status files and the
store's locks: a worker waiting for its store (held by a reader or a dying predecessor) or
for its broker, a worker killed with its status left behind, who owns the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.config import Settings
from core.errors import CrawlfleetError
from crawlfleet.health import DEAD, WAITING, worker_state

OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "n/a"
#: A lease (session timeout, max poll interval) must be this many p95 durations long.
LEASE_FACTOR = 3.0
#: Below this, robots.txt is fetched again so often it is repeated work of its own.
MIN_ROBOTS_TTL_S = 60.0
#: A worker waiting longer than this for its store or broker is a FAIL (the fleet stands
#: still), shorter a warning (a restart in progress).
WAIT_FAIL_S = 30.0
#: How long doctor waits for a starting store worker to serve its query.
STORE_WAIT_S = 5.0


@dataclass(frozen=True)
class Durations:
    """Per-request fetch durations in seconds over a window (``count`` = 0: no data)."""

    count: int
    p50: float
    p95: float
    p99: float
    max: float
    window_s: float


@dataclass(frozen=True)
class Check:
    name: str
    value: str
    verdict: str
    fix: str = ""


def _s(x: float) -> str:
    return f"{x:.3g} s" if x < 100 else f"{x:,.0f} s"


def lease_checks(s: Settings, statuses: list[dict[str, Any]]) -> list[Check]:
    """``max.poll.interval.ms`` against the longest gap between two polls each live worker
    measured (``poll_gap_ms``): that gap -- a batch of parse, store or retry, one pass of
    fetch's admission loop -- is what the lease must outlast. The session timeout is kept by
    librdkafka's heartbeat thread whatever a worker does, and a fetch request runs beside
    the polls, so neither is checked against fetch durations."""
    gaps: dict[str, int] = {}
    for st in statuses:
        if worker_state(st).state == DEAD:
            continue
        gap = int((st.get("gauges") or {}).get("poll_gap_ms", 0))
        stage = str(st.get("stage", "?"))
        gaps[stage] = max(gaps.get(stage, 0), gap)
    name = f"max_poll_interval_ms >= {LEASE_FACTOR:g}x longest gap between polls"
    if not gaps:
        return [Check(name, f"{s.max_poll_interval_ms} ms", NA,
                      "no live worker to measure: run doctor beside a running fleet "
                      "(its --data-dir and --topic-prefix)")]
    worst = max(gaps.values())
    need = LEASE_FACTOR * worst
    value = ", ".join(f"{st} {ms:,} ms" for st, ms in sorted(gaps.items()))
    ok = s.max_poll_interval_ms >= need
    return [Check(name, f"{s.max_poll_interval_ms:,} ms vs {need:,.0f} ({value})",
                  OK if ok else FAIL, "" if ok else
                  f"raise max_poll_interval_ms to at least {math.ceil(need)}, or lower "
                  "store_batch_rows / the batch size: a worker whose batch outlives the "
                  "lease is dropped from its group and its batch is redone by the next owner")]


def seen_ttl_check(s: Settings) -> Check:
    """Dedupe keys must outlive a job's retries plus its lease (config refuses otherwise;
    this shows the margin)."""
    horizon = s.dedupe_horizon_s
    ok = s.seen_ttl_s > horizon
    margin = s.seen_ttl_s / horizon if horizon > 0 else math.inf
    verdict = FAIL if not ok else (WARN if margin < 1.1 else OK)
    return Check("seen_ttl_s > retry horizon + lease",
                 f"{_s(s.seen_ttl_s)} vs {_s(horizon)} ({s.max_attempts - 1} retries + "
                 f"max_poll_interval)", verdict,
                 "" if verdict == OK else f"raise seen_ttl_s well above {horizon:.0f} (a key "
                 "expiring before the job's last retry lets it be fetched twice)")


def seen_retention_check(s: Settings, retention_ms: int | None) -> Check:
    """The broker's retention of ``crawl.seen`` is what a restore gets back: it is set when
    the topic is created, and later settings do not change it."""
    name = "crawl.seen retention.ms >= seen_ttl_s"
    if retention_ms is None:
        return Check(name, "no such topic", NA, "`crawlfleet topics create` sets it from "
                     "seen_ttl_s")
    if retention_ms < 0:
        return Check(name, "unlimited", OK)
    kept = retention_ms / 1000.0
    value = f"{_s(kept)} vs {_s(s.seen_ttl_s)} (horizon {_s(s.dedupe_horizon_s)})"
    fix = (f"kafka-configs --alter --entity-type topics --entity-name "
           f"{s.topic_prefix}crawl.seen --add-config retention.ms="
           f"{int(s.seen_ttl_s * 1000)}")
    if kept <= s.dedupe_horizon_s:
        return Check(name, value, FAIL, f"{fix}: a worker that restores the dedupe state "
                     "has lost the keys of jobs still inside their retry horizon and "
                     "fetches them again")
    if kept < s.seen_ttl_s:
        return Check(name, value, WARN, f"{fix}: keys are kept shorter than seen_ttl_s says")
    return Check(name, value, OK)


def transaction_check(s: Settings, txn_timeout_ms: int) -> Check:
    """A dead worker's open transaction blocks the next owner until it times out; a short
    one aborts every batch while a broker pauses (librdkafka caps produce timeouts by it)."""
    name = "session/3 <= transaction timeout <= session_timeout_ms"
    value = f"{txn_timeout_ms} ms vs {s.session_timeout_ms} ms"
    if txn_timeout_ms > s.session_timeout_ms:
        return Check(name, value, WARN, f"raise session_timeout_ms to {txn_timeout_ms}: until "
                     "a dead worker's open transaction times out, read_committed readers and "
                     "the new owner's restore wait behind it, past the lease")
    if txn_timeout_ms * LEASE_FACTOR < s.session_timeout_ms:
        return Check(name, value, WARN, "a broker pause longer than the transaction timeout "
                     "aborts every batch in flight: keep it near session_timeout_ms")
    return Check(name, value, OK)


def commit_check(s: Settings) -> Check:
    """Finished work waits up to commit_interval_s for its transaction."""
    ok = s.commit_interval_s * 1000 < s.session_timeout_ms / LEASE_FACTOR
    return Check("commit_interval_s < session_timeout_ms / 3",
                 f"{_s(s.commit_interval_s)} vs {_s(s.session_timeout_ms / 3000)}",
                 OK if ok else FAIL,
                 "" if ok else "lower commit_interval_s: every worker that stops loses the "
                 "finished, uncommitted work of a whole interval, which is then redone")


def rate_checks(s: Settings, d: Durations | None) -> list[Check]:
    """Caps against the per-target in-flight limit (Little's law: in flight = rate x time)."""
    out: list[Check] = []
    limit = s.max_inflight_per_target
    if s.max_inflight < limit:
        out.append(Check("max_inflight >= max_inflight_per_target",
                         f"{s.max_inflight} vs {limit}", WARN,
                         f"raise max_inflight to {limit} or more: a worker cannot give one "
                         "target its in-flight limit"))
    if s.max_buffered < s.max_inflight:
        out.append(Check("max_buffered >= max_inflight", f"{s.max_buffered} vs "
                         f"{s.max_inflight}", WARN, "raise max_buffered: a worker pauses its "
                         "inputs before it can fill its in-flight slots"))
    caps = {"rate_cap": s.rate_cap, **{f"rate_caps[{t}]": c for t, c in s.rate_caps.items()}}
    if d is None or d.count == 0:
        out.append(Check("rate caps reachable with max_inflight_per_target",
                         f"limit {limit}", NA, "no fetch durations to size in-flight from"))
        return out
    for name, cap in caps.items():
        need = cap * d.p95
        ok = need <= limit
        out.append(Check(f"{name} reachable with max_inflight_per_target",
                         f"{cap:g}/s x p95 {_s(d.p95)} = {need:.1f} in flight vs {limit}",
                         OK if ok else WARN,
                         "" if ok else f"raise max_inflight_per_target to {math.ceil(need)} "
                         f"or lower {name}: at this site's p95 the cap cannot be reached"))
    return out


def other_checks(s: Settings) -> list[Check]:
    out: list[Check] = []
    if s.connect_timeout_s >= s.request_timeout_s:
        out.append(Check("connect_timeout_s < request_timeout_s",
                         f"{_s(s.connect_timeout_s)} vs {_s(s.request_timeout_s)}", WARN,
                         "lower connect_timeout_s: the request timeout always fires first"))
    if s.robots_ttl_s < MIN_ROBOTS_TTL_S:
        out.append(Check(f"robots_ttl_s >= {MIN_ROBOTS_TTL_S:g}", _s(s.robots_ttl_s), WARN,
                         "raise robots_ttl_s: robots.txt is fetched again and again"))
    if 0 < s.frontier_lag_bound < s.max_buffered:
        out.append(Check("frontier_lag_bound >= max_buffered",
                         f"{s.frontier_lag_bound} vs {s.max_buffered}", WARN,
                         "raise frontier_lag_bound: publishers block before one fetch worker's "
                         "buffer is full"))
    if s.fleet_rate_cap and s.fleet_rate_cap < s.rate_cap:
        out.append(Check("fleet_rate_cap >= rate_cap", f"{s.fleet_rate_cap:g} vs "
                         f"{s.rate_cap:g}", WARN, "the per-target cap is never reached: "
                         "lower rate_cap or raise fleet_rate_cap"))
    return out


def worker_checks(statuses: list[dict[str, Any]]) -> list[Check]:
    """Workers that cannot work: waiting for their store or broker, or killed (a clean exit
    removes its status, a kill -9 leaves it behind)."""
    out: list[Check] = []
    for st in statuses:
        w = worker_state(st)
        gauges = st.get("gauges", {})
        if w.state == DEAD:
            out.append(Check(f"{w.stage} worker {w.worker} runs", f"not running ({w.detail})",
                             WARN, f"start it again: crawlfleet worker {w.stage} "
                             f"--worker-id {w.worker} (a supervisor should)"))
        elif w.state == WAITING:
            kafka = bool(gauges.get("kafka_waiting"))
            waited = float(gauges.get("kafka_waiting_s" if kafka else "store_waiting_s", 0))
            verdict = FAIL if waited >= WAIT_FAIL_S else WARN
            if kafka:
                fix = ("start the broker (`crawlfleet kafka up`, or the cluster's) or fix "
                       "bootstrap_servers: the worker goes on as soon as Kafka answers")
            else:
                fix = ("it starts by itself once the holder lets go: a reader started before "
                       "the store worker finishes its query (stop it if it hangs), a killed "
                       "predecessor exits; two live store workers never share one embedded "
                       "store -- give each its own --data-dir, or use a ClickHouse server")
            out.append(Check(f"{w.stage} worker {w.worker} "
                             + ("reaches Kafka" if kafka else "has its store"),
                             f"waiting {waited:.0f} s: {w.detail}", verdict, fix))
    if not statuses:
        out.append(Check("workers", "no worker status here", NA,
                         "doctor reads the status files of --data-dir and --topic-prefix"))
    elif not out:
        out.append(Check("workers", f"{len(statuses)} running, none waiting", OK))
    return out


def store_owner_check(s: Settings) -> Check:
    """Who owns the embedded store: readers go through a running owner, never around it."""
    from infra.clickhouse import PORT_FILE, StoreOwnership
    name = "store owner"
    if s.clickhouse_dsn.get():
        return Check(name, "a ClickHouse server", NA)
    if not s.clickhouse_path.exists():
        return Check(name, f"no store at {s.clickhouse_path.resolve()}", NA)
    owner = StoreOwnership(s)
    if not owner.lock.held():
        return Check(name, "no store worker runs", OK if not (
            s.clickhouse_path / PORT_FILE).exists() else WARN,
            "" if not (s.clickhouse_path / PORT_FILE).exists() else
            "a port file was left by a killed store worker: harmless (readers check the "
            "owner lock), removed when the next one starts")
    holder = owner.holder()
    serving = (s.clickhouse_path / PORT_FILE).exists()
    who = holder.describe() if holder is not None else "a store worker"
    return Check(name, f"{who}, " + ("serving queries" if serving else "not serving yet"),
                 OK if serving else WARN,
                 "" if serving else "it is waiting for its store or starting: see the "
                 "store worker's check above")


def checks(s: Settings, d: Durations | None, txn_timeout_ms: int,
           statuses: list[dict[str, Any]] | None = None) -> list[Check]:
    """Every check, in the order they are printed."""
    return [*lease_checks(s, statuses or []), seen_ttl_check(s),
            transaction_check(s, txn_timeout_ms), commit_check(s), *rate_checks(s, d),
            *other_checks(s)]


def failed(results: list[Check]) -> bool:
    return any(c.verdict == FAIL for c in results)


def fetch_durations(s: Settings, window_s: float) -> Durations:
    """p50/p95/p99 of page requests over the last ``window_s`` (through the running store
    worker when there is one, as ``crawlfleet sql``)."""
    from infra.clickhouse import job_duration_sql
    from infra.store_query import run_query
    _, rows = run_query(s, job_duration_sql(window_s), wait_s=STORE_WAIT_S,
                        on_wait=lambda _: None)
    count, quantiles, top = rows[0] if rows else (0, [0, 0, 0], 0)
    p50, p95, p99 = (float(q or 0) / 1000.0 for q in quantiles)
    return Durations(int(count), p50, p95, p99, float(top or 0) / 1000.0, window_s)


def seen_retention_ms(s: Settings) -> int | None:
    """``retention.ms`` of the crawl's ``crawl.seen`` topic on the broker (None: no topic)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource  # not re-exported for mypy

    from core.errors import InfraError
    from crawlfleet.reach import resolve_bootstrap
    from infra.topics import topology_of

    s = resolve_bootstrap(s, start_local=False)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topology_of(s).seen)
    admin = AdminClient({**s.kafka_common(), "socket.timeout.ms": 5000})
    try:
        configs = admin.describe_configs([resource], request_timeout=10)[resource].result(10)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise InfraError(f"cannot describe {resource.name}: {exc.args[0].str()}") from exc
    return int(configs["retention.ms"].value)


def kafka_check(s: Settings) -> Check:
    """Whether the configured (or local) Kafka answers: the first thing a stalled fleet needs."""
    from crawlfleet.reach import reach_kafka
    try:
        where = reach_kafka(s).bootstrap_servers
    except CrawlfleetError as exc:
        return Check("kafka", "unreachable", FAIL, str(exc))
    return Check("kafka", f"answers at {where}", OK, "")


def diagnose(s: Settings, window_s: float,
             kafka: bool = True) -> tuple[list[Check], Durations | None]:
    """The checks for ``s`` with the store's durations (none if the store cannot say) and,
    with ``kafka``, the broker's retention of the dedupe state."""
    from streams.io import producer_conf
    txn_ms = int(producer_conf(s, "doctor", "doctor")["transaction.timeout.ms"])
    from streams.status import read_statuses
    durations: Durations | None
    # What stands still now first: the store query below may wait for a starting worker.
    statuses = read_statuses(s.status_dir)
    note: list[Check] = [*worker_checks(statuses), store_owner_check(s)]
    try:
        durations = fetch_durations(s, window_s)
    except CrawlfleetError as exc:
        durations = None
        note.append(Check("fetch durations", "unavailable", NA, str(exc)))
    if durations is not None:
        note.append(Check(f"fetch durations (last {window_s:g} s)",
                          f"{durations.count} requests, p50 {_s(durations.p50)}, p95 "
                          f"{_s(durations.p95)}, p99 {_s(durations.p99)}, max "
                          f"{_s(durations.max)}", OK if durations.count else NA))
    results = checks(s, durations, txn_ms, statuses)
    if kafka:
        reach = kafka_check(s)
        note.insert(0, reach)
        if reach.verdict == FAIL:
            return [*note, *results], durations
        try:
            retention = seen_retention_check(s, seen_retention_ms(s))
        except CrawlfleetError as exc:
            retention = Check("crawl.seen retention.ms >= seen_ttl_s", "unavailable", NA,
                              str(exc))
        results.insert(results.index(seen_ttl_check(s)) + 1, retention)
    return [*note, *results], durations
