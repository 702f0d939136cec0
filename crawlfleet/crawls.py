"""The crawl an operator command means, and the crawls a broker holds (issue 44).

A one-off ``crawl`` runs in a namespace of its own (``c<unix time>-<hex>.``) beside any shared
fleet namespace (no prefix). An operator command (``pause``, ``cap``, ``top``, ...) given no
``--topic-prefix`` acts on the crawl running on its data dir (read from ``crawl.lock``, held
by that crawl's process), else on the shared namespace; a command whose namespace has no
topics says so at once and names the fix, instead of producing into nothing for 30 s.

``crawlfleet crawls`` lists every namespace on the broker (from its topics and groups) with
its state: running (a crawl on this data dir holds it), interrupted (topics left, nobody
runs it) or finished (only consumer groups left); ``crawls rm`` removes one's topics and
groups. Each crawl's end is noted in ``crawls.jsonl`` in the data dir (pages, state), the
only record of a finished crawl whose topics are gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from core.config import Settings
from core.errors import ConfigError, InfraError
from infra.topics import topology_of

#: The crawl's own lock file in its data dir (written by :func:`crawlfleet.crawl.hold_data_dir`).
CRAWL_LOCK = "crawl.lock"
#: One line per crawl that ended on this data dir: prefix, started, ended, state, pages.
HISTORY = "crawls.jsonl"
_CONTROL = "crawl.control"
_GROUP = re.compile(r"^(?P<prefix>.*?)crawlfleet-[A-Za-z0-9_.-]+$")
_ONE_OFF = re.compile(r"^c(?P<t>\d{9,11})-[0-9a-f]{6}\.$")

RUNNING, INTERRUPTED, FINISHED, SHARED = "running", "interrupted", "finished", "shared"


class NoSuchCrawlError(ConfigError):
    """The namespace a command would act on has no topics on the broker."""

    reason = "no_such_crawl"


def running_crawl(data_dir: Path) -> dict[str, Any] | None:
    """The lock of the crawl running on ``data_dir`` ({pid, topic_prefix, started}), or None.

    Held means held: the crawl's process keeps an exclusive flock for its life, so a lock
    file a crashed or finished crawl left behind is not mistaken for a running crawl."""
    path = data_dir / CRAWL_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: a crawl runs
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
    finally:
        os.close(fd)
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def normal_prefix(name: str) -> str:
    """A crawl name as typed (``c1796609957-efecf9`` or with its dot) as a topic prefix."""
    return name if not name or name.endswith(".") else name + "."


def pick_namespace(settings: Settings, given: str | None) -> Settings:
    """``settings`` on the crawl a command means: ``given`` (a prefix or crawl name), else
    the configured prefix, else the crawl running on the data dir, else the shared one."""
    if given is not None:
        return settings.replace(topic_prefix=normal_prefix(given))
    if settings.topic_prefix:
        return settings
    holder = running_crawl(settings.data_dir)
    if holder and holder.get("topic_prefix"):
        return settings.replace(topic_prefix=str(holder["topic_prefix"]))
    return settings


def require_namespace(settings: Settings, timeout_s: float = 10.0) -> Settings:
    """``settings`` if its namespace has topics on the broker; else one error at once naming
    the crawls there are and the fix."""
    admin = AdminClient(settings.kafka_common())
    try:
        topics = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    if topology_of(settings).control in topics:
        return settings
    where = f"crawl {settings.topic_prefix}" if settings.topic_prefix else \
        "the shared namespace (no --topic-prefix)"
    others = sorted(_prefixes_of_topics(topics))
    running = [p for p in others if p]
    hint = (f"crawls with topics on this broker: {', '.join(running)}; pick one with "
            "--topic-prefix NAME (`crawlfleet crawls` lists them)") if running else \
        "no crawl has topics on this broker"
    fix = "run `crawlfleet topics create` to make the shared fleet's topics" \
        if not settings.topic_prefix else "check the name (`crawlfleet crawls`)"
    raise NoSuchCrawlError(f"{where} has no topics on {settings.bootstrap_servers}: {hint}; "
                           f"or {fix}")


def _prefixes_of_topics(topics: set[str]) -> set[str]:
    return {t[:-len(_CONTROL)] for t in topics if t.endswith(_CONTROL)}


@dataclass(frozen=True)
class CrawlInfo:
    prefix: str  # "" for the shared namespace
    state: str  # RUNNING, INTERRUPTED, FINISHED or SHARED
    started: float | None  # Unix time, from the one-off name or the lock (None: unknown)
    pages: int | None  # pages fetched (from the history, else the fetched topic's records)
    topics: int
    groups: int

    def row(self) -> tuple[str, str, str, str, str]:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.started)) + " UTC" \
            if self.started else "?"
        pages = "?" if self.pages is None else str(self.pages)
        return (self.prefix or "(shared)", started, pages, self.state,
                f"{self.topics} topics, {self.groups} groups")


COLUMNS = ("crawl (--topic-prefix)", "started", "pages", "state", "on the broker")


def history(data_dir: Path) -> dict[str, dict[str, Any]]:
    """prefix → the last noted end of that crawl on ``data_dir``."""
    out: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for line in (data_dir / HISTORY).read_text().splitlines():
            with contextlib.suppress(ValueError, TypeError):
                entry = json.loads(line)
                out[str(entry["prefix"])] = entry
    return out


def note_end(data_dir: Path, prefix: str, started: float, state: str, pages: int) -> None:
    """Append one crawl's end to the data dir's history (what `crawls` shows once its
    topics are gone)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / HISTORY).open("a") as fh:
        fh.write(json.dumps({"prefix": prefix, "started": round(started, 3),
                             "ended": round(time.time(), 3), "state": state,
                             "pages": pages}) + "\n")


def list_crawls(settings: Settings, timeout_s: float = 10.0) -> list[CrawlInfo]:
    """Every namespace on the broker (topics or groups), oldest first."""
    admin = AdminClient(settings.kafka_common())
    try:
        metadata = admin.list_topics(timeout=timeout_s).topics
        groups = [g.group_id for g in
                  admin.list_consumer_groups(request_timeout=timeout_s).result().valid]
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    prefixes = _prefixes_of_topics(set(metadata))
    by_group: dict[str, int] = {}
    for g in groups:
        m = _GROUP.match(g)
        if m:
            by_group[m["prefix"]] = by_group.get(m["prefix"], 0) + 1
    holder = running_crawl(settings.data_dir) or {}
    past = history(settings.data_dir)
    out = []
    for prefix in prefixes | set(by_group):
        n_topics = sum(1 for t in metadata if t.startswith(prefix) and
                       t[len(prefix):].startswith("crawl.")) if prefix else \
            sum(1 for t in metadata if t.startswith("crawl."))
        m = _ONE_OFF.match(prefix)
        started = float(m["t"]) if m else None
        if holder.get("topic_prefix") == prefix:
            state, started = RUNNING, float(holder.get("started") or started or 0) or None
        elif not prefix:
            state = SHARED
        elif prefix in prefixes:
            state = INTERRUPTED
        else:
            state = FINISHED
        pages = past.get(prefix, {}).get("pages")
        if pages is None and prefix in prefixes and state != SHARED:
            pages = _records(settings, prefix, metadata)
        out.append(CrawlInfo(prefix, state, started, pages, n_topics, by_group.get(prefix, 0)))
    return sorted(out, key=lambda c: (c.started or 0.0, c.prefix))


def _records(settings: Settings, prefix: str, metadata: Any) -> int | None:
    """Records on the prefix's fetched topic (one per page fetched)."""
    from confluent_kafka import Consumer
    name = topology_of(settings.replace(topic_prefix=prefix)).fetched
    topic = metadata.get(name)
    if topic is None or topic.error is not None:
        return None
    consumer = Consumer({**settings.kafka_common(), "group.id": "crawlfleet-crawls-list",
                         "enable.auto.commit": False})
    try:
        total = 0
        for p in topic.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=5)
            total += max(0, high - low)
        return total
    except KafkaException:
        return None
    finally:
        consumer.close()


def remove_crawl(settings: Settings, prefix: str, timeout_s: float = 30.0) -> tuple[int, int]:
    """Delete a crawl's topics and consumer groups; (topics, groups) deleted. The shared
    namespace and a running crawl are refused."""
    prefix = normal_prefix(prefix)
    if not prefix:
        raise ConfigError("`crawls rm` removes one crawl's namespace; the shared one (no "
                          "prefix) is not removed this way")
    holder = running_crawl(settings.data_dir) or {}
    if holder.get("topic_prefix") == prefix:
        raise ConfigError(f"crawl {prefix} is running (pid {holder.get('pid')}): stop it "
                          "first (Ctrl-C, or kill -TERM the pid)")
    admin = AdminClient(settings.kafka_common())
    try:
        topics = sorted(t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix))
        groups = sorted(g.group_id for g in
                        admin.list_consumer_groups(request_timeout=10).result().valid
                        if g.group_id.startswith(prefix))
    except KafkaException as exc:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    if not topics and not groups:
        raise NoSuchCrawlError(f"no topics or groups named {prefix}* on "
                               f"{settings.bootstrap_servers} (`crawlfleet crawls` lists them)")
    deleted_topics = deleted_groups = 0
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=timeout_s).values():
            with contextlib.suppress(KafkaException):
                fut.result()
                deleted_topics += 1
    if groups:
        deleted_groups = _delete_groups(settings, admin, groups, timeout_s)
    return deleted_topics, deleted_groups


def remove_groups(settings: Settings, timeout_s: float = 10.0) -> int:
    """Delete the consumer groups of a one-off crawl that ended (``settings.topic_prefix``,
    never the shared namespace's), so a finished crawl leaves nothing on the broker; the
    groups deleted. Best effort: a broker that does not answer leaves them to `crawls rm`."""
    if not settings.topic_prefix:
        return 0
    admin = AdminClient(settings.kafka_common())
    try:
        groups = sorted(g.group_id for g in
                        admin.list_consumer_groups(request_timeout=10).result().valid
                        if g.group_id.startswith(settings.topic_prefix))
    except KafkaException:
        return 0
    return _delete_groups(settings, admin, groups, timeout_s) if groups else 0


def _delete_groups(settings: Settings, admin: AdminClient, groups: list[str],
                   timeout_s: float) -> int:
    _remove_static_members(settings, admin, groups)
    deleted, left = 0, list(groups)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        for group, fut in admin.delete_consumer_groups(left, request_timeout=timeout_s).items():
            with contextlib.suppress(KafkaException):
                fut.result()
                deleted += 1
                left.remove(group)
        if left:
            time.sleep(0.2)  # a group rebalancing after its members were removed
    return deleted


def _remove_static_members(settings: Settings, admin: AdminClient, groups: list[str]) -> None:
    """Remove the static members a stopped crawl's groups still hold: a static member's
    close sends no LeaveGroup, and a group with members cannot be deleted until their
    sessions time out (``session_timeout_ms``)."""
    from streams.group_leave import leave_group
    for fut in admin.describe_consumer_groups(groups, request_timeout=10).values():
        with contextlib.suppress(KafkaException):
            desc = fut.result()
            for member in desc.members:
                if member.group_instance_id:
                    leave_group(settings, desc.group_id, member.group_instance_id)


def store_place(settings: Settings) -> str:
    """Where a crawl's pages are, said as shared: every crawl of a data dir (or of one
    ClickHouse server) writes the same tables, so `crawlfleet sql` sees them all."""
    dsn = settings.clickhouse_dsn.get()
    if dsn:
        host = urlsplit(dsn).hostname or "?"  # never the DSN: it may carry a password
        return f"ClickHouse server {host}, shared by every crawl that uses it"
    return (f"{settings.clickhouse_path.resolve()}, shared by every crawl of the data dir "
            f"{settings.data_dir.resolve()}")
