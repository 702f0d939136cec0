"""The all-in-one crawl: local infra, topics, one process per stage, progress, summary.

Stages run as separate processes exactly as a deployment runs them
(:mod:`crawlfleet.fleet`), so the all-in-one exercises the real pipeline.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from core.config import Settings
from core.errors import InfraError
from crawlfleet import health
from crawlfleet.crawls import CRAWL_LOCK, note_end, remove_groups, store_place
from crawlfleet.dlq import dead_letter_sqls

# Fleet, Plan and settings_env lived here first: re-exported for their many users.
from crawlfleet.fleet import PARTITIONS_PER_WORKER as PARTITIONS_PER_WORKER
from crawlfleet.fleet import Fleet, Plan
from crawlfleet.fleet import settings_env as settings_env
from crawlfleet.health import HeldRecheck, HeldWork, StallWatch, read_held_work, stalls
from crawlfleet.phases import Phases
from crawlfleet.progress import _progress_line, _progress_table, paused_notes, starting_stages
from crawlfleet.reach import resolve_bootstrap
from infra import kafka_local
from infra.broker_note import note_broker, noted_bootstrap
from infra.lag import LagProbe
from infra.store_query import run_query
from infra.topics import adopt_partitions, create_topics, delete_topics, topology_of
from producers.frontier import PublishReport, jobs_from_lines, publish
from schemas.stages import analytics_stages, stages_where
from schemas.topics import Topology
from streams.status import holds_work, read_statuses

IDLE_S = 1.0


@dataclass
class Summary:
    topic_prefix: str
    partitions: int
    seeds_published: int
    seed_errors: int
    pages_stored: int
    pages_ok: int
    dead_letters: int
    dead_by_reason: dict[str, int]
    errors_by_class: dict[str, int]
    #: The command's wall time: from its process's start (interpreter, imports, a broker it
    #: starts) to the end of its teardown (workers stopped, topics deleted), as a user waits.
    seconds: float
    pages_per_s: float
    crawl_seconds: float  # first page fetched → last page stored (what peers time)
    crawl_pages_per_s: float
    drained: bool
    interrupted: bool = False  # SIGINT or SIGTERM ended it: its topics are kept to resume
    restarts: int = 0
    topics_deleted: int = 0  # this run's own topics, deleted once it drained
    #: target → why its URLs were refused and which setting allows them (once per target)
    address_hints: dict[str, str] = field(default_factory=dict)
    published_at: float = 0.0  # Unix time the seeds' publication began
    publish_seconds: float = 0.0  # seeds' publication begun → last page stored
    start_seconds: float = 0.0  # workers started → last page stored (start-up, joins)
    #: Hop latency of the crawl's links, a page's request to its link's request (ms):
    #: p50, p90, p99 and the number of hops ("n"); see :func:`hop_sql`.
    hop_ms: dict[str, float] = field(default_factory=dict)
    first_fetch_at: float = 0.0  # Unix time of the first page fetched (of those stored)
    last_store_at: float = 0.0  # Unix time of the last page stored
    #: Seconds from the command's start (its module's import) to each step of the crawl:
    #: topics, workers started, ready, published, first fetch, last store, drained, stopped.
    phases: dict[str, float] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    store: str = ""  # where the pages are: every crawl of one data dir shares this store
    paused: bool = False  # the fetch workers were paused (`crawlfleet pause`) at the end


def run_crawl(settings: Settings, seeds: Iterable[str], plan: Plan, *,
              console: Console | None = None, timeout_s: float | None = None,
              keep_topics: bool = False,
              on_start: Callable[[Settings], None] | None = None) -> Summary:
    """Crawl from ``seeds`` until the pipeline drains (or ``timeout_s``); return a summary.

    Without a configured topic prefix the crawl gets a namespace of its own
    (:func:`one_off_prefix`), sized to ``plan`` unless ``partitions`` is set, and refuses a
    prefix that already names any topic or group; once it has drained, the topics it created
    and its groups are deleted (unless ``keep_topics``): the results are in ClickHouse, and
    nothing can resume a finished one-off crawl. A crawl that did not drain keeps them, so it
    can be resumed with ``--topic-prefix`` (which adopts existing topics and their partition
    count, and deletes nothing). The data dir is held for the crawl's life
    (:func:`hold_data_dir`). ``on_start`` is told the crawl's settings (its prefix) once
    it holds the data dir, before anything is crawled: what resumes it is known from the
    start. SIGINT (KeyboardInterrupt) ends it with a summary marked interrupted; its topics
    are kept, so it can be resumed.
    """
    console = console or Console(stderr=True)
    phases, began = Phases(), time.time()
    if not settings.bootstrap_servers and not kafka_local.status().running:
        settings = settings.replace(bootstrap_servers=noted_bootstrap())  # another folder's
    starting = not settings.bootstrap_servers and not kafka_local.status().running
    if starting:
        console.print("no Kafka configured and the local broker is not running: starting it "
                      "(`crawlfleet kafka up`; `crawlfleet kafka down` stops it)")
        # Its address is known once it is spawned: the workers start (and wait for it)
        # while it comes up; the crawl waits for it before it makes its topics.
        settings = settings.replace(bootstrap_servers=kafka_local.up(wait=False))
        note_broker()
    else:
        settings = resolve_bootstrap(settings, start_local=True)
        phases.mark("broker")
    seeds = list(seeds)
    if settings.scope == "seeds" and not settings.allowed_targets:
        settings = settings.replace(allowed_targets=_seed_targets(seeds, settings))
    ephemeral = not settings.topic_prefix
    if ephemeral:
        settings = settings.replace(topic_prefix=one_off_prefix())
    if ephemeral and not settings.partitions:
        settings = settings.replace(partitions=plan.partitions())
    with hold_data_dir(settings):
        if on_start is not None:
            on_start(settings)
        # With its partition count known (always, for a one-off crawl) a worker needs
        # nothing of the broker: the workers start, and import, while the topics are made
        # (each waits for its topics before it joins its group).
        fleet = _fleet(settings, plan) if settings.partitions else None
        if fleet is not None:
            fleet.start()
            phases.mark("workers_started")
        try:
            if starting:
                kafka_local.up()
                phases.mark("broker")
            settings = adopt_partitions(settings)
            created = [name for name, how in create_topics(settings, fresh=ephemeral).items()
                       if how == "created"]
        except BaseException:
            if fleet is not None:
                fleet.stop()
            raise
        phases.mark("topics")
        summary = _crawl(settings, seeds, plan, console, timeout_s, phases,
                         fleet or _fleet(settings, plan),
                         frontier_empty=topology_of(settings).frontier in created)
        note_end(settings.data_dir, settings.topic_prefix, began,
                 "interrupted" if summary.interrupted else
                 "finished" if summary.drained else "timed out", summary.pages_stored)
        if ephemeral and not keep_topics and not summary.interrupted:
            try:
                summary.topics_deleted = len(delete_topics(settings, topics=created))
                remove_groups(settings)  # static members stay past their close: removed here
            except InfraError as exc:
                console.print(f"[yellow]topics of {settings.topic_prefix} not deleted: {exc}")
            if not summary.drained:
                console.print(f"[yellow]timed out: this run's topics ({settings.topic_prefix}*) "
                              "were deleted; to resume a crawl later, run it with --keep-topics "
                              "and then again with the same --topic-prefix")
    phases.mark("ended")
    summary.phases = phases.marks
    summary.seconds = phases.marks["ended"]
    summary.pages_per_s = round(summary.pages_stored / summary.seconds, 1) \
        if summary.seconds > 0 else 0.0
    return summary


def _fleet(settings: Settings, plan: Plan) -> Fleet:
    return Fleet(settings, plan, settings.data_dir / "logs" / settings.topic_prefix.rstrip("."))


def _crawl(settings: Settings, seeds: list[str], plan: Plan, console: Console,
           timeout_s: float | None, phases: Phases, fleet: Fleet,
           frontier_empty: bool = False) -> Summary:
    """Start the fleet (unless started) on provisioned topics, publish, watch until drained;
    stop the fleet.

    The seeds are published while the workers start (their groups read from the earliest
    offset), so the first request goes out as soon as the fetch group has joined. Once
    drained, every worker but the store's is told to stop while the summary is read from
    the store, which is stopped last."""
    if not fleet.started:
        fleet.start()
        phases.mark("workers_started")
    started, start_wall = fleet.started_at, fleet.started_wall
    report, published_wall, interrupted = PublishReport(), time.time(), False
    try:
        requesting = stages_where("sends_requests")
        if any(fleet.plan.workers(st) > 1 for st in requesting):
            # Several fetch workers: publish once they all hold their partitions. The first
            # to join would otherwise start on every target and hand most of them over
            # mid-crawl, each a pause of ~2 s (bench.polite_bench, 4 workers: efficiency
            # 0.94-0.96). One worker has nobody to wait for: its seeds go out at once.
            wait_ready(settings, fleet, FETCH_STABLE_WAIT_S, stages=requesting)
            phases.mark("fetch_stable")
        published_wall = time.time()
        report = publish(seeds, settings, frontier_empty=frontier_empty)
        phases.mark("published")
        for line, reason in report.errors:
            console.print(f"seed line {line}: {reason}", style="yellow", markup=False)
        if report.profile_warning():
            console.print(f"seeds: {report.profile_warning()}", style="yellow", markup=False)
        try:
            drained = _watch(settings, fleet, console, timeout_s, started)
        except KeyboardInterrupt:
            # Ctrl-C (or SIGTERM, made one by the CLI): every worker leaves its group
            # cleanly first, then the summary is read from the store, opened here.
            interrupted, drained = True, False
        phases.mark("interrupted" if interrupted else "drained" if drained else "timed_out")
        elapsed = time.monotonic() - started
        # The workers' last word is read before they are told to stop: a worker removes
        # its status file as it exits, and one that exits while the store answers the
        # summary's queries (seconds, on a large crawl) would be missing from it.
        statuses = read_statuses(settings.status_dir)
        if interrupted:
            fleet.stop()
        else:
            fleet.signal(but=stages_where("store_owner"))
        summary = _summarise(settings, report, start_wall, elapsed, drained, fleet,
                             published_wall, statuses)
        summary.interrupted = interrupted
        if summary.pages_stored:
            phases.mark_wall("first_fetch", summary.first_fetch_at)
            phases.mark_wall("last_store", summary.last_store_at)
        return summary
    finally:
        fleet.stop()
        phases.mark("stopped")


def one_off_prefix() -> str:
    """A one-off crawl's namespace: ``c<unix time>-<6 random hex digits>.``.

    The time keeps names readable and in start order; the random part keeps apart two
    crawls started in the same second on one broker, which would otherwise share topics,
    groups, transactional ids and static member ids, fence each other, store each other's
    pages and delete each other's topics (24 bits: a clash needs ~4,000 crawls in a second).
    """
    return f"c{int(time.time())}-{secrets.token_hex(3)}."


class DataDirBusyError(InfraError):
    """Another live crawl holds this data dir (and the embedded store in it)."""

    reason = "data_dir_busy"




@contextlib.contextmanager
def hold_data_dir(settings: Settings) -> Iterator[None]:
    """Hold ``settings.data_dir`` for one crawl, or refuse naming the crawl that holds it.

    The embedded store admits one process per path: a second crawl on the same dir would
    start a store worker that fails on chDB's own lock, deep in its log. An flock is released
    by the kernel when its holder dies, so a crashed crawl never leaves the dir held; the
    file says who holds it. A crawl whose store is a ClickHouse server takes no lock: its
    statuses, logs and local state in the data dir are all per topic prefix.
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.clickhouse_dsn.get():
        yield
        return
    path = settings.data_dir / CRAWL_LOCK
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)  # not inherited by the stage processes
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(settings, path) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "topic_prefix": settings.topic_prefix,
                                 "started": round(time.time(), 3)}).encode())
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (unlinking it would race a locker)


def _busy(settings: Settings, path: Path) -> DataDirBusyError:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):  # the holder is writing it right now
        holder = {}
    pid = holder.get("pid", "unknown")
    topics = f", topics {holder['topic_prefix']}*" if holder.get("topic_prefix") else ""
    return DataDirBusyError(
        f"another crawl (pid {pid}{topics}) is using the data dir "
        f"{settings.data_dir.resolve()}, and its embedded store admits one crawl at a time: "
        "give this crawl a data dir of its own (--data-dir DIR or CRAWLFLEET_DATA_DIR), or "
        "wait until that crawl has finished")


def wait_ready(settings: Settings, fleet: Fleet, timeout_s: float = 60.0,
               stages: tuple[str, ...] | None = None) -> bool:
    """Block until every worker (of ``stages``, default all) has joined its group and each
    group holds all its partitions.

    Seeds published earlier would be fetched while the parse group is still forming, and
    the crawl's first hops would wait on its rebalance. False after ``timeout_s`` (the crawl
    then goes on regardless: a late member only joins late).

    Read from the workers' status files (each writes its consumer's assignment after every
    rebalance), not by describing the groups: a group describe is a coordinator request,
    and when one times out (a fresh three-node cluster, a broker going down) librdkafka 2.x
    may abort the whole process (librdkafka#4605, ``eonce->refcnt > 0``).
    """
    deadline = time.monotonic() + timeout_s
    topo = topology_of(settings)
    seen: tuple[tuple[str, int], ...] | None = None
    since = 0.0
    while True:
        now = time.monotonic()
        marks = _settled(settings, fleet, topo, stages)
        if marks is None or marks != seen:
            seen, since = marks, now
        elif now - since >= READY_QUIET_S:
            return True
        if now > deadline or refusals(read_statuses(settings.status_dir)):
            return False  # a refused worker joins nothing until approved: _watch says so
        fleet.heal()
        time.sleep(READY_TICK_S)


def refusals(statuses: list[dict[str, Any]]) -> list[str]:
    """What workers refusing to consume say (their version tuple is not approved): they
    stay up and idle, so the fleet never restarts them; the crawl shows why it waits."""
    return sorted({f"{st.get('stage')} {st.get('worker')}: {st['waiting']}" for st in statuses
                   if str(st.get("waiting", "")).startswith("refused: ")})


#: How often wait_ready looks again, and how long the members' reports must stay settled
#: and unchanged: in a cooperative rebalance a joining member may report its (empty) first
#: assignment a moment before the member giving partitions up reports its revocation.
READY_TICK_S = 0.1
READY_QUIET_S = 0.5
#: The longest a crawl with several fetch workers waits for them all before it publishes
#: anyway (a late or refused worker then joins late, as it would have).
FETCH_STABLE_WAIT_S = 20.0


def _settled(settings: Settings, fleet: Fleet, topo: Topology,
             stages: tuple[str, ...] | None = None) -> tuple[tuple[str, int], ...] | None:
    """Every live stage process has joined (a resumed crawl's stale status files do not
    count) and, per stage, its members hold each subscribed topic's partitions once each:
    then each member's rebalance count (to tell a later rebalance), else None."""
    pids = {p.pid for p in fleet.procs.values() if p.poll() is None}
    joined: dict[str, list[dict[str, Any]]] = {}
    for st in read_statuses(settings.status_dir):
        if st.get("pid") in pids and st.get("rebalances", 0) > 0:
            joined.setdefault(str(st.get("stage")), []).append(st)
    marks: list[tuple[str, int]] = []
    for stage, n in fleet.plan.counts().items():
        if stages is not None and stage not in stages:
            continue
        members = joined.get(stage, [])
        if len(members) < n:
            return None
        held = sorted((t, p) for st in members for t, p in st.get("assignment", []))
        want = sorted((t, p) for t in topo.subscription(stage) + topo.followers(stage)
                      for p in range(topo.partitions))
        if held != want:
            return None  # a partition unowned (moving) or held twice (mid-rebalance)
        marks += [(str(st.get("worker")), int(st["rebalances"])) for st in members]
    return tuple(sorted(marks))


def _seed_targets(lines: list[str], settings: Settings) -> tuple[str, ...]:
    report = PublishReport()
    return tuple(sorted({j["target"] for j in jobs_from_lines(lines, settings, report)}))


#: How often a crawl whose output is not a terminal prints its progress line.
PLAIN_PROGRESS_S = 5.0


def _watch(settings: Settings, fleet: Fleet, console: Console, timeout_s: float | None,
           started: float) -> bool:
    """Show progress until drained (True) or ``timeout_s`` (False).

    Drained is decided by the broker: every stage's group has committed to the end of its
    inputs, the parked and timer changelogs hold no live entry and no open transaction,
    and a second look at the offsets, taken after the changelogs were read, finds every
    end offset where the first look found it (one look is not a snapshot: a transaction
    committing between the reads of two topics could hide its records). The workers'
    gauges must also hold nothing, a necessary check, never a sufficient one. Once no
    lag is left, or only the store's (its last batches), the loop looks every
    ``QUICK_TICK_S`` (else every ``TICK_S``), so a drained crawl is known within a
    fraction of a second.
    A stage with lag and no serving worker is shown as stalled, with why.
    """
    topo = topology_of(settings)
    probe = LagProbe(settings)
    stall_watch = StallWatch()
    held: HeldWork | None = None
    held_note = ""
    recheck = HeldRecheck(HELD_FIRST_RECHECK_S, HELD_RECHECK_S)
    quiet = tail = False
    # A terminal gets a live table; a pipe or a file gets a plain line every few seconds.
    live = Live(console=console, refresh_per_second=4, transient=False) \
        if console.is_terminal else contextlib.nullcontext()
    last_line = 0.0
    shown: list[str] = []
    quarantines = health.QuarantineDrain(settings, analytics_stages())
    try:
        with live:
            while True:
                time.sleep(QUICK_TICK_S if quiet or tail else TICK_S)
                fleet.heal()
                statuses = read_statuses(settings.status_dir)
                lags = probe.stage_lags(topo)
                ends = dict(probe.ends)
                now = time.monotonic()
                starting = starting_stages(fleet, statuses)
                stalled = stall_watch.update({st: why for st, why in stalls(lags, statuses).items()
                                              if st not in starting}, now)
                quiet = _calm(statuses, lags, fleet)
                tail = not quiet and _calm(statuses, lags, fleet, but=stages_where("store_owner"))
                drained = False
                if not quiet:
                    held = None
                    recheck.reset()
                elif recheck.due(now, held):
                    recheck.reading(now, held)
                    try:
                        held, held_note = read_held_work(settings), ""
                    except InfraError as exc:
                        held, held_note = None, f"changelogs unreadable: {exc}"
                    if held is not None and held.empty:
                        again = probe.stage_lags(topo)
                        drained = all(v == 0 for v in again.values()) and probe.ends == ends
                notes = paused_notes(statuses) + list(stalled.values()) + refusals(statuses)
                q_note, q_said = quarantines.look(statuses, lags)
                notes += [q_note] if q_note else []
                if q_said:  # nothing else left: a one-off crawl does not wait them out
                    console.print(q_said, markup=False, highlight=False)
                if held is not None and not held.empty:
                    notes.append(f"not drained, the broker holds: {held.describe()}")
                elif held_note:
                    notes.append(held_note)
                if isinstance(live, Live):
                    live.update(_progress_table(statuses, lags, now - started, notes))
                elif now - last_line >= PLAIN_PROGRESS_S or (notes and notes != shown):
                    last_line = now  # and at once when what holds the crawl changes
                    console.print(_progress_line(statuses, lags, now - started, notes))
                shown = notes
                if drained:
                    return True
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    return False
    finally:
        probe.close()


#: How often the crawl looks at its pipeline while work is under way (a look costs ~5 ms
#: of CPU: 2% of a core), and once every stage's lag reads zero. At 0.5 s a crawl whose
#: last burst drained within one look was known drained 0.25 s later on average (a
#: 200-page crawl: 0.16-1.14 s from its last stored page to drained, most 0.3-0.6 s).
TICK_S = 0.25
QUICK_TICK_S = 0.1
#: While the gauges say calm but the broker holds work, the changelogs are read again after
#: the first wait, then twice as long each time, up to the second (:class:`HeldRecheck`).
HELD_FIRST_RECHECK_S = 0.25
HELD_RECHECK_S = 2.0


def _calm(statuses: list[dict[str, Any]], lags: dict[str, int], fleet: Fleet,
          but: tuple[str, ...] = ()) -> bool:
    """No stage behind its input, and no worker's gauges holding work or waiting (the
    stages ``but`` left out: with the store's, "only the store's last batches are left").

    Necessary, not sufficient: ``_watch`` also requires the parked and timer changelogs
    empty and settled on the broker (:func:`crawlfleet.health.read_held_work`) and the
    offsets unchanged across them."""
    counts = fleet.plan.counts()
    expected = sum(n for stage, n in counts.items() if stage not in but)
    # Analytics (the quarantine app) is never waited on: its lag is no work of the crawl.
    statuses = [s for s in statuses
                if s.get("stage") not in analytics_stages() and s.get("stage") not in but]
    if len(statuses) < expected:
        return False
    for s in statuses:
        g = s.get("gauges", {})
        if holds_work(g) or s.get("waiting"):
            return False
    return all(v == 0 for stage, v in lags.items() if stage not in but)


def _summarise(settings: Settings, report: PublishReport, start_wall: float, elapsed: float,
               drained: bool, fleet: Fleet, published_wall: float,
               statuses: list[dict[str, Any]]) -> Summary:
    since = f"toDateTime64({start_wall - 1:.3f}, 3, 'UTC')"
    # Values interpolated below are floats, never user text (the prefix is bound as a literal).
    pages_sql = f"SELECT count(), countIf(status BETWEEN 200 AND 299), dateDiff('millisecond', min(fetched_at), max(stored_at)), toUnixTimestamp64Milli(max(stored_at)), toUnixTimestamp64Milli(min(fetched_at)) FROM pages FINAL WHERE stored_at >= {since}"  # noqa: E501, S608
    dead_sql, hint_sql = dead_letter_sqls(settings.topic_prefix)
    err_sql = f"SELECT reason, count() FROM fetch_events FINAL WHERE ts >= {since} AND outcome != 'ok' GROUP BY reason ORDER BY reason"  # noqa: E501, S608
    _, rows = run_query(settings, pages_sql)
    pages, ok, window_ms = int(rows[0][0]), int(rows[0][1]), int(rows[0][2] or 0)
    last_stored = int(rows[0][3] or 0) / 1000.0 if pages else 0.0
    first_fetched = int(rows[0][4] or 0) / 1000.0 if pages else 0.0
    _, hop_rows = run_query(settings, hop_sql(since))
    _, dead_rows = run_query(settings, dead_sql)
    _, err_rows = run_query(settings, err_sql)
    dead = {str(r): int(n) for r, n in dead_rows}
    _, hint_rows = run_query(settings, hint_sql) if "address_not_allowed" in dead else ([], [])
    return Summary(
        topic_prefix=settings.topic_prefix, partitions=settings.topic_partitions,
        seeds_published=report.published,
        seed_errors=len(report.errors), pages_stored=pages, pages_ok=ok,
        dead_letters=sum(dead.values()), dead_by_reason=dead,
        errors_by_class={str(r): int(n) for r, n in err_rows}, seconds=round(elapsed, 3),
        pages_per_s=round(pages / elapsed, 1) if elapsed > 0 else 0.0,
        crawl_seconds=window_ms / 1000.0,
        crawl_pages_per_s=round(pages * 1000.0 / window_ms, 1) if window_ms > 0 else 0.0,
        drained=drained,
        restarts=fleet.restarts, statuses=statuses,
        address_hints={str(t): str(e) for t, e in hint_rows},
        published_at=round(published_wall, 3),
        publish_seconds=round(max(0.0, last_stored - published_wall), 3),
        start_seconds=round(max(0.0, last_stored - start_wall), 3),
        first_fetch_at=first_fetched, last_store_at=last_stored,
        hop_ms=_hops(hop_rows), store=store_place(settings),
        paused=bool(paused_notes(statuses)))


def hop_sql(since: str) -> str:
    """Each link's hop since ``since``: its page's request (``fetched_at``) minus the request
    of the page it was found on, joined through the parse stage's lineage (``enqueued``,
    with ``parent_url``). On a chain of single links this is the pipeline's latency per hop
    (fetch, commit, parse, commit, next request); on a wide crawl it includes queueing."""
    return ("SELECT quantiles(0.5, 0.9, 0.99)(hop), count() FROM (SELECT dateDiff('millisecond', "  # noqa: S608
            "p.fetched_at, c.fetched_at) AS hop FROM (SELECT url, fetched_at FROM pages FINAL "
            f"WHERE stored_at >= {since} AND depth > 0) AS c INNER JOIN (SELECT url, "
            "any(parent_url) AS parent_url FROM lineage FINAL WHERE state = 'enqueued' AND "
            f"stage = 'parse' AND ts >= {since} GROUP BY url) AS l ON l.url = c.url INNER JOIN "
            f"(SELECT url, fetched_at FROM pages FINAL WHERE stored_at >= {since}) AS p "
            "ON p.url = l.parent_url)")


def _hops(rows: list[list[Any]]) -> dict[str, float]:
    if not rows or not rows[0][1]:
        return {}
    q = [float(x) for x in rows[0][0]]
    return {"p50": q[0], "p90": q[1], "p99": q[2], "n": float(rows[0][1])}


def print_summary(summary: Summary, console: Console) -> None:
    t = Table(title="crawl summary", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("topic prefix", f"{summary.topic_prefix} ({summary.partitions} partitions" + (
        f", {summary.topics_deleted} topics deleted after the crawl)"
        if summary.topics_deleted else ")"))
    t.add_row("seeds published", str(summary.seeds_published))
    t.add_row("bad seed lines", str(summary.seed_errors))
    t.add_row("pages stored", str(summary.pages_stored))
    t.add_row("  of which 2xx", str(summary.pages_ok))
    t.add_row("dead letters", str(summary.dead_letters))
    for reason, n in summary.dead_by_reason.items():
        t.add_row(f"  dead: {reason}", str(n))
    for reason, n in summary.errors_by_class.items():
        t.add_row(f"  failed attempts: {reason}", str(n))
    t.add_row("seconds (wall: command start to end, broker start and teardown included)",
              f"{summary.seconds:.1f}")
    t.add_row("pages/s (wall)", f"{summary.pages_per_s:.1f}")
    t.add_row("first fetch → last store (s)", f"{summary.crawl_seconds:.1f}")
    t.add_row("pages/s (first fetch → last store)", f"{summary.crawl_pages_per_s:.1f}")
    if summary.hop_ms:
        h = summary.hop_ms
        t.add_row("link hop p50 / p90 / p99 (ms)",
                  f"{h['p50']:.0f} / {h['p90']:.0f} / {h['p99']:.0f} ({h['n']:.0f} links)")
    t.add_row("drained", "yes" if summary.drained else
              "no (interrupted)" if summary.interrupted else "no (timed out)")
    if summary.paused:
        t.add_row("paused", "yes (`crawlfleet resume` goes on)")
    if summary.store:
        t.add_row("pages stored in", summary.store)
    if summary.restarts:
        t.add_row("worker restarts", str(summary.restarts))
    console.print(t)
    for target, why in summary.address_hints.items():
        console.print(f"[yellow]refused {target}:[/yellow] {why}")


def summary_json(summary: Summary, path: Path) -> None:
    data = asdict(summary)
    data.pop("statuses", None)
    path.write_text(json.dumps(data, indent=2))
