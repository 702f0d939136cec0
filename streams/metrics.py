"""Prometheus metrics of one worker, served on ``metrics_bind:metrics_port`` when asked.

Off by default (``metrics_port`` = -1): recording is then one attribute test and the
``prometheus_client`` package is not even imported. Two kinds of metric:

- recorded where they happen, with low-cardinality labels only (never a target or a URL):
  fetch requests by ``outcome`` and ``status_class``, their durations, dead letters by
  ``reason`` (the failure class), restore durations;
- read from the worker's :class:`~streams.status.StatusFile` at scrape time: its gauges
  (in flight, queued, parked, deferred targets, restoring ...) and counters (transactions
  committed and aborted, partitions assigned, revoked and lost, restores ...), so the hot
  paths count each thing once, in the status.

Every metric carries ``stage`` and ``worker``; ``crawlfleet_build_info`` carries the
worker's version tuple, which the fetch request counter repeats (one value per process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from core.config import Settings
from core.errors import ConfigError
from core.versions import version_labels

log = logging.getLogger("crawlfleet.metrics")

#: Status gauges under their metric names (others: ``crawlfleet_worker_<name>``).
GAUGES: dict[str, tuple[str, str]] = {
    "inflight": ("crawlfleet_inflight_requests", "Requests in flight."),
    "poll_gap_ms": ("crawlfleet_poll_gap_ms",
                    "Longest gap between two polls over the last 5-10 min (a batch, or a pass "
                    "of the admission loop): max.poll.interval.ms must outlast it."),
    "target_slots": ("crawlfleet_target_slots",
                     "Targets the fetch scheduler keeps state for (<= max_target_state)."),
    "robots_rules": ("crawlfleet_robots_rules", "Origins with robots.txt rules cached."),
    "robots_intervals": ("crawlfleet_robots_intervals",
                         "Targets with a Crawl-delay / Request-rate remembered."),
    "target_health": ("crawlfleet_target_health",
                      "Targets with adaptive health state (degraded or recovering)."),
    "queued": ("crawlfleet_queued_jobs", "Jobs queued in memory, waiting for their target."),
    "parked": ("crawlfleet_parked_jobs", "Jobs parked on disk beyond their target's share."),
    "uncommitted": ("crawlfleet_uncommitted_results",
                    "Jobs finished but not committed yet: requests a crash now would repeat."),
    "deferred_targets": ("crawlfleet_deferred_targets",
                         "Targets resting (Retry-After, back-off, robots unreachable, window)."),
    "seen_keys": ("crawlfleet_seen_keys", "Dedupe keys in the worker's seen store."),
    "paused": ("crawlfleet_paused", "1 while the worker's inputs are paused because it is full."),
    "restoring": ("crawlfleet_restoring_partitions",
                  "Partitions paused until their state is restored."),
    "restore_failing": ("crawlfleet_restore_failing_partitions",
                        "Partitions whose state restore failed (retried, kept paused)."),
    "recovering": ("crawlfleet_recovering",
                   "1 while the quarantine app rebalances or recovers its table (not ready)."),
    "timers": ("crawlfleet_retry_timers", "Retries waiting in the timer store."),
    "held_partitions": ("crawlfleet_held_partitions", "Input partitions held back."),
    "members": ("crawlfleet_fetch_group_members", "Live members of the fetch group."),
    "store_waiting": ("crawlfleet_store_waiting",
                      "1 while the store worker waits for its store (held by a reader or a "
                      "dying predecessor, or its server not up); it starts once it can."),
    "store_waiting_s": ("crawlfleet_store_waiting_seconds",
                        "Seconds the store worker has waited for its store so far."),
    "refused": ("crawlfleet_refused",
                "1 while the worker refuses to consume: its version tuple is not in the "
                "fleet's approved set (crawlfleet approved)."),
    "kafka_waiting": ("crawlfleet_kafka_waiting",
                      "1 while the worker waits for its Kafka brokers to answer."),
    "kafka_waiting_s": ("crawlfleet_kafka_waiting_seconds",
                        "Seconds the worker has waited for Kafka so far."),
    "live_parked": ("crawlfleet_parked_live_entries",
                    "Live entries of crawl.parked as the broker holds them (store worker's "
                    "sampler, every sample_interval_s)."),
    "live_timers": ("crawlfleet_timers_live_entries",
                    "Live entries of crawl.timers as the broker holds them (store worker's "
                    "sampler, every sample_interval_s)."),
    "active_quarantines": ("crawlfleet_active_quarantines",
                           "Quarantines in force, as the quarantine app last counted them."),
    "unsettled_partitions": ("crawlfleet_changelog_unsettled_partitions",
                             "Partitions of crawl.parked and crawl.timers with an open "
                             "transaction when last read (their live entries may change)."),
}

#: Status counters under their own metric families: name -> (family, help, label, value).
COUNTERS: dict[str, tuple[str, str, str | None, str | None]] = {
    "committed_txns": ("crawlfleet_transactions", "Kafka transactions, by result.",
                       "result", "committed"),
    "aborted_txns": ("crawlfleet_transactions", "Kafka transactions, by result.",
                     "result", "aborted"),
    "assigned_partitions": ("crawlfleet_rebalance_partitions",
                            "Partitions that changed hands in rebalances, by change.",
                            "change", "assigned"),
    "revoked_partitions": ("crawlfleet_rebalance_partitions",
                           "Partitions that changed hands in rebalances, by change.",
                           "change", "revoked"),
    "lost_partitions": ("crawlfleet_rebalance_partitions",
                        "Partitions that changed hands in rebalances, by change.",
                        "change", "lost"),
    "fenced": ("crawlfleet_fenced", "Times the worker was fenced and rejoined.", None, None),
    "restores": ("crawlfleet_restores", "Completed state restores.", None, None),
    "restore_failures": ("crawlfleet_restore_failures", "State restores that failed.",
                         None, None),
    "deferrals": ("crawlfleet_fetch_deferrals", "Targets deferred (rested).", None, None),
    "held_for_commit": ("crawlfleet_fetch_held_for_commit",
                        "Times new requests waited for a commit (max_uncommitted reached: a "
                        "slow broker).", None, None),
    **{f"quarantines_{scope}": ("crawlfleet_quarantines",
                                "Quarantines the quarantine app issued, by scope.", "scope", scope)
       for scope in ("profile", "egress", "target")},
    "second_order": ("crawlfleet_quarantines_second_order",
                     "Quarantines issued within the window after a neighbour on the same "
                     "target was quarantined (the cascade the design keeps at 0-1).",
                     None, None),
}

#: Request durations (seconds): loopback pages to a request timeout's worth.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)
RESTORE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def status_class(status: int) -> str:
    """``2xx`` ... ``5xx`` for an HTTP status; ``none`` when no answer came (errors)."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "none"




class WorkerMetrics:
    """One worker's metrics; a no-op until :meth:`serve` starts the HTTP endpoint."""

    def __init__(self, stage: str, worker: str) -> None:
        self.stage, self.worker = stage, worker
        self.on = False
        self.port: int | None = None
        self._server: Any = None
        self._requests: dict[tuple[str, str], Any] = {}
        self._durations: dict[str, Any] = {}
        self._dead: dict[str, Any] = {}

    def serve(self, settings: Settings, status: Any) -> int:
        """Register the metrics, start serving them, return the port (0 picks a free one)."""
        from prometheus_client import CollectorRegistry, Counter, Histogram, Info

        base = {"stage": self.stage, "worker": self.worker}
        versions = version_labels(settings)
        self.registry = CollectorRegistry(auto_describe=True)
        Info("crawlfleet_build", "The worker's version tuple.", list(base),
             registry=self.registry).labels(**base).info(versions)
        vlabels = {k: versions[k] for k in ("fetcher_version", "code_revision",
                                            "profile_bundle_version")}
        self._req_family = Counter(
            "crawlfleet_fetch_requests", "HTTP requests sent for pages, by outcome (stored, "
            "blocked, retry, dead) and status class (2xx..5xx, none = no answer).",
            [*base, "outcome", "status_class", *vlabels], registry=self.registry)
        self._req_labels = {**base, **vlabels}
        self._dur_family = Histogram(
            "crawlfleet_fetch_request_duration_seconds", "Page request durations, by outcome.",
            [*base, "outcome"], buckets=DURATION_BUCKETS, registry=self.registry)
        self._dead_family = Counter(
            "crawlfleet_dead_letters", "Dead letters this worker produced, by reason.",
            [*base, "reason"], registry=self.registry)
        self._restore = Histogram(
            "crawlfleet_restore_duration_seconds", "Durations of completed state restores.",
            list(base), buckets=RESTORE_BUCKETS, registry=self.registry).labels(**base)
        self.registry.register(StatusCollector(status, base))
        try:
            self._server = _serve(settings.metrics_bind, settings.metrics_port,
                                  self.registry, status)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {settings.metrics_bind}:"
                              f"{settings.metrics_port}: {exc}") from exc
        self.port = int(self._server.server_address[1])
        self.on = True
        log.info("%s %s: metrics on http://%s:%d/metrics (and /ready)", self.stage, self.worker,
                 settings.metrics_bind, self.port)
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.on = False

    # --- recording (cheap no-ops while off) -----------------------------------------------

    def request(self, outcome: str, status: int, seconds: float) -> None:
        """One page request that was sent (answered or not), and how it ended."""
        if not self.on:
            return
        key = (outcome, status_class(status))
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self._req_family.labels(
                outcome=key[0], status_class=key[1], **self._req_labels)
        child.inc()
        hist = self._durations.get(outcome)
        if hist is None:
            hist = self._durations[outcome] = self._dur_family.labels(
                stage=self.stage, worker=self.worker, outcome=outcome)
        hist.observe(seconds)

    def dead_letter(self, reason: str) -> None:
        if not self.on:
            return
        child = self._dead.get(reason)
        if child is None:
            child = self._dead[reason] = self._dead_family.labels(
                stage=self.stage, worker=self.worker, reason=reason)
        child.inc()

    def restored(self, seconds: float) -> None:
        if self.on:
            self._restore.observe(seconds)


class StatusCollector:
    """Exposes a StatusFile's gauges and counters at scrape time (copied, never locked)."""

    def __init__(self, status: Any, labels: dict[str, str]) -> None:
        self.status = status
        self.labels = labels

    def describe(self) -> list[Any]:
        return []  # families depend on what the stage reports: collected at each scrape

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        names, values = list(self.labels), list(self.labels.values())
        gauges: dict[str, int] = dict(self.status.gauges)  # computed ones: on its thread
        for name, value in sorted(gauges.items()):
            metric, doc = GAUGES.get(name, (f"crawlfleet_worker_{name}", f"Status gauge {name}."))
            g = GaugeMetricFamily(metric, doc, labels=names)
            g.add_metric(values, float(value))
            yield g
        counters: dict[str, int] = dict(self.status.counters)
        families: dict[str, Any] = {}
        events = CounterMetricFamily("crawlfleet_worker_events",
                                     "The worker's status counters, by event.",
                                     labels=[*names, "event"])
        for name, value in sorted(counters.items()):
            spec = COUNTERS.get(name)
            if spec is None:
                events.add_metric([*values, name], float(value))
                continue
            metric, doc, label, label_value = spec
            fam = families.get(metric)
            if fam is None:
                fam = families[metric] = CounterMetricFamily(
                    metric, doc, labels=[*names, *([label] if label else [])])
            fam.add_metric([*values, *([label_value] if label_value else [])], float(value))
        yield from families.values()
        yield events


def ready_app(status: Any, metrics_app: Any) -> Any:
    """A WSGI app: ``/ready`` answers the worker's readiness (200, or 503 with the reason,
    from :func:`streams.readiness.readiness` on its live status); every other path is the
    Prometheus exposition."""
    from streams.readiness import readiness

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO", "").rstrip("/") != "/ready":
            return metrics_app(environ, start_response)
        verdict = readiness(status.snapshot())
        body = (("ready: " if verdict.ready else "not ready: ") + verdict.reason + "\n").encode()
        start_response(f"{verdict.http_status} {'OK' if verdict.ready else 'Service Unavailable'}",
                       [("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body)))])
        return [body]

    return app


def _serve(bind: str, port: int, registry: Any, status: Any) -> Any:
    """The metrics and readiness endpoint on its own daemon thread (what prometheus_client's
    ``start_http_server`` does, with ``/ready`` beside ``/metrics``)."""
    import socket
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """A probe every few seconds is not news."""

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    family, _, _, _, addr = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM,
                                               flags=socket.AI_PASSIVE)[0]
    Server.address_family = family
    httpd = make_server(str(addr[0]), port, ready_app(status, make_wsgi_app(registry)),
                        Server, handler_class=Quiet)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return httpd


#: A gauge computed when the status is written (at most every 0.5 s), not on every loop.
GaugeFn = Callable[[], int]
