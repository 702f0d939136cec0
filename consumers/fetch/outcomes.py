"""The fetch stage's outcome rules: a response or an error → the records it produces.

One finished request becomes: its outputs (page, retry or dead letter, and its telemetry
event carrying the version tuple: a record of its own, or for a page, fields of the page's
record that the store turns into the event's row), the dedupe state to write, and the
:class:`Signal` it gives its target's adaptive limits (with the site's Retry-After, if any).
Pure apart from encoding: no Kafka, no clock beyond timestamps on the records.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass
from typing import cast

from consumers.attempts import AttemptFields, VersionFields, fetch_event
from consumers.fetch.classify import Signal, Verdict, classify_status, error_signal
from consumers.fetch.conditional import (
    ETAG,
    LAST_MODIFIED,
    NOT_MODIFIED,
    NOT_MODIFIED_OUTCOME,
    is_conditional,
)
from consumers.fetch.http import REDIRECT_STATUSES, Response
from consumers.fetch.seen import DEAD, DONE, RETRYING
from consumers.scope import follow
from core.config import Settings
from core.errors import (
    CrawlfleetError,
)
from core.profiles import EGRESS_META
from core.urls import resolve_link, target_of
from core.versions import FETCHER_VERSION, HTTP_LIB_VERSION, TLS_LIB_VERSION, code_revision
from producers.replay import without_replay
from schemas.keys import REDIRECT_HOPS
from schemas.lineage import ENQUEUED, lineage_event
from schemas.pipeline import RETRY_DELAYS_S
from schemas.records import CrawlJob, FetchResult, Seen, SeenState
from schemas.topics import Topology
from streams.io import Encoder, Output
from streams.ledger import Pending


def placed_job(pj: Pending) -> CrawlJob:
    """The job as this attempt was sent, for every record it produces (page, retry, dead
    letter): the profile placed for it and, in ``meta``, the egress it went through (a
    retry after a block or timeout avoids that egress). An unpinned job's dedupe key has no
    profile in it, so naming the placed one changes no key."""
    job = pj.job
    if not pj.profile:
        return job
    return {**job, "profile": pj.profile,
            "meta": {**(job.get("meta") or {}), EGRESS_META: pj.egress}}


def redirect_hops(job: CrawlJob) -> int:
    value = (job.get("meta") or {}).get(REDIRECT_HOPS, "0")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 6 else 0


@dataclass
class Result:
    outputs: list[Output]
    seen: tuple[str, int]  # the job's dedupe state once this commits
    signal: Signal = Signal.NEUTRAL
    retry_after_s: float | None = None
    outcome: str = ""  # its telemetry event's: ok, blocked, retry, dead
    reason: str = ""  # ... and failure class (a dead letter's reason)


class OutcomeRules:
    def __init__(self, settings: Settings, topology: Topology, encoder: Encoder,
                 worker: str) -> None:
        self.s = settings
        self.topology = topology
        self.enc = encoder
        self.worker = worker
        self.block_statuses = frozenset(settings.block_statuses)
        #: Event ids: 16 random hex digits per worker process, then a count (a uuid4 per
        #: event cost a random read each; unique all the same: a restart draws new digits).
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()
        self.code_revision = code_revision(settings)  # the real one unless configured
        #: The worker's version tuple, carried by every page it fetches (and its events).
        self.versions: VersionFields = {
            "profile_bundle_version": settings.profile_bundle_version,
            "http_version": HTTP_LIB_VERSION, "tls_version": TLS_LIB_VERSION,
            "code_revision": self.code_revision}

    def response(self, pj: Pending, resp: Response, started: float) -> Result:
        job = placed_job(pj)
        if resp.status in REDIRECT_STATUSES and resp.location is not None:
            return self.redirect(pj, resp, started)
        if resp.status == NOT_MODIFIED and job.get("visit", 0) > 0 \
                and is_conditional(job.get("validators")):
            return self.not_modified(pj, resp, started)
        outcome = classify_status(resp.status, resp.retry_after, job["attempt"],
                                  block_statuses=self.block_statuses)
        if outcome.verdict is Verdict.STORE:
            label = "blocked" if outcome.blocked else "ok"
            page: FetchResult = {
                "job": job, "final_url": resp.url, "status": resp.status,
                "content_type": resp.content_type, "body": resp.body,
                "fetched_at_ms": int(time.time() * 1000), "elapsed_ms": resp.elapsed_ms,
                "redirects": resp.redirects, "worker": self.worker, **self.versions,
                **self.attempt(label, outcome.reason, started),
                "validators": resp.validators, **resp.exchange.fields()}
            result = self.enc.record(self.topology.fetched, pj.target, pj.key.encode(), page)
            # The page carries its attempt's telemetry (the store's fetch_events row comes
            # from it); a block's event also goes to the quarantine app's own input.
            blocks = [self.event(pj, resp.status, label, outcome.reason, started,
                                 len(resp.body), self.topology.blocks)] \
                if outcome.blocked else []
            return Result([result, *blocks],
                          (DONE, job["attempt"]), outcome.signal, outcome=label,
                          reason=outcome.reason)
        if outcome.verdict is Verdict.RETRY:
            res = self.retry_or_dead(pj, outcome.reason, outcome.delay_s, resp.status, started)
        else:
            res = self.dead(pj, outcome.reason, f"HTTP {resp.status} from {resp.url}",
                            resp.status, started)
        res.signal, res.retry_after_s = outcome.signal, outcome.retry_after_s
        return res

    def not_modified(self, pj: Pending, resp: Response, started: float) -> Result:
        """A 304 to a revisit's conditional GET: a visit of its own, outcome
        ``not_modified``, with no body (the store keeps the page's last version) and the
        validators the next visit sends (a 304 may update them, RFC 9110 15.4.5)."""
        job = placed_job(pj)
        validators = {k: v for k, v in (job.get("validators") or {}).items()
                      if k in (ETAG, LAST_MODIFIED)}
        page: FetchResult = {
            "job": job, "final_url": resp.url, "status": resp.status,
            "content_type": resp.content_type, "body": b"",
            "fetched_at_ms": int(time.time() * 1000), "elapsed_ms": resp.elapsed_ms,
            "redirects": resp.redirects, "worker": self.worker, **self.versions,
            # a success in the attempt's telemetry (success rates count it as one); the
            # visit's outcome, not_modified, is read from the status (page_visits)
            **self.attempt("ok", NOT_MODIFIED_OUTCOME, started),
            "validators": {**validators, **resp.validators}, **resp.exchange.fields()}
        return Result([self.enc.record(self.topology.fetched, pj.target, pj.key.encode(),
                                       page)],
                      (DONE, job["attempt"]), Signal.OK, outcome="ok",
                      reason=NOT_MODIFIED_OUTCOME)

    def redirect(self, pj: Pending, resp: Response, started: float) -> Result:
        """A redirect is an answer of its own: the page is recorded with its 3xx status and
        the Location, and an in-scope target becomes a new frontier job (dedupe, robots.txt
        and the rate cap of its own target apply, as for a link). Out of scope, not
        crawlable or past ``max_redirects`` hops, it is recorded with that reason only."""
        job = placed_job(pj)
        assert resp.location is not None
        to = resolve_link(resp.url, resp.location)
        hops = redirect_hops(job)
        s = self.s
        if to is None or not follow(to, job["target"], 0, scope=s.scope, max_depth=-1,
                                    target_mode=s.target_mode, allowed=s.allowed_targets):
            reason = "redirect_out_of_scope"
        elif to == job["url"] or hops >= s.max_redirects:
            reason = "redirect_loop"
        else:
            reason = "redirect"
        page: FetchResult = {
            "job": job, "final_url": resp.url, "status": resp.status,
            "content_type": resp.content_type, "body": b"",
            "fetched_at_ms": int(time.time() * 1000), "elapsed_ms": resp.elapsed_ms,
            "redirects": [to or resp.location[:2048]], "worker": self.worker,
            **self.versions, **self.attempt("ok", reason, started), "validators": {},
            **resp.exchange.fields()}
        outputs = [self.enc.record(self.topology.fetched, pj.target, pj.key.encode(), page)]
        if reason == "redirect" and to is not None:
            child: CrawlJob = {
                **job, "url": to, "target": target_of(to, s.target_mode), "attempt": 0,
                "parent_url": job["url"], "last_error": None, "delay_ms": 0,
                "meta": {**without_replay(job.get("meta")), REDIRECT_HOPS: str(hops + 1)},
                # a page of its own: its first visit (a revisit's validators were the
                # redirecting URL's)
                "visit": 0, "validators": {}}
            topic = self.topology.frontier_high if child.get("priority", 0) > 0 \
                else self.topology.frontier
            outputs += [lineage_event(self.enc, child, ENQUEUED, "fetch", "redirect", job["url"]),
                        self.enc.job(topic, child)]
        return Result(outputs, (DONE, job["attempt"]), Signal.OK, outcome="ok", reason=reason)

    def error(self, pj: Pending, exc: CrawlfleetError, started: float) -> Result:
        """A request that got no usable answer: timeouts and refused connections slow the
        target like a 5xx; a prompt answer with broken bytes does not; other errors (our
        own refusals, bad URLs) say nothing about it (``classify.error_signal``)."""
        signal = error_signal(exc)
        if exc.retryable:
            res = self.retry_or_dead(pj, exc.reason, 0.0, 0, started, str(exc))
        else:
            res = self.dead(pj, exc.reason, str(exc), 0, started)
        res.signal = signal
        return res

    def retry_or_dead(self, pj: Pending, reason: str, delay_s: float, status: int,
                      started: float, error: str = "") -> Result:
        job = placed_job(pj)
        attempt = job["attempt"] + 1
        if attempt >= self.s.max_attempts:
            return self.dead(pj, reason, error or f"gave up after {attempt} attempts",
                             status, started)
        tier = self.topology.retry_tier_for(delay_s)
        # The exact delay (at least the shortest tier's): the retry stage's timer store
        # fires each job when its own delay is up, whatever tier carried it.
        again: CrawlJob = {**job, "attempt": attempt, "last_error": reason,
                           "delay_ms": int(max(delay_s, RETRY_DELAYS_S[0]) * 1000)}
        return Result([self.enc.job(self.topology.retry(tier), again),
                       self.event(pj, status, "retry", reason, started, 0)],
                      (RETRYING, attempt), outcome="retry", reason=reason)

    def dead(self, pj: Pending, reason: str, error: str, status: int,
             started: float) -> Result:
        job = placed_job(pj)
        return Result([self.enc.dead(job, None, pj.tp[0], reason, error, job["attempt"] + 1),
                       self.event(pj, status, "dead", reason, started, 0)],
                      (DEAD, job["attempt"]), outcome="dead", reason=reason)

    def park(self, pj: Pending) -> Output:
        """The parked-queue changelog record of a job going to disk (see ``parking``)."""
        assert pj.park_key is not None
        return self.enc.record(self.topology.parked, pj.target, pj.park_key, pj.job)

    def unpark(self, pj: Pending) -> Output:
        """The tombstone of a parked job's entry, written when the job moves on."""
        assert pj.park_key is not None
        return self.enc.record(self.topology.parked, pj.target, pj.park_key, None)

    def seen(self, pj: Pending, state: tuple[str, int]) -> Output:
        # The state is one of consumers.fetch.seen's DONE, RETRYING, DEAD (the ledger keeps str).
        record: Seen = {"state": cast(SeenState, state[0]), "attempt": state[1], "status": 0}
        return self.enc.record(self.topology.seen, pj.target, pj.key.encode(), record)

    def unseen(self, pj: Pending, key: str) -> Output:
        """The tombstone of an earlier visit's dedupe key (``visit_prune``), with ``pj``'s."""
        return self.enc.record(self.topology.seen, pj.target, key.encode(), None)

    def attempt(self, outcome: str, reason: str, started: float) -> AttemptFields:
        """The telemetry a fetched record carries for its attempt (FetchResult v3)."""
        return {"outcome": outcome, "reason": reason,
                "attempt_ms": int((time.monotonic() - started) * 1000),
                "fetcher_version": FETCHER_VERSION}

    def event(self, pj: Pending, status: int, outcome: str, reason: str, started: float,
              size: int, topic: str | None = None) -> Output:
        """The attempt's telemetry event, on ``crawl.telemetry`` unless another topic is
        named (a fetched page carries its own: :meth:`attempt`)."""
        job = pj.job
        record = fetch_event(
            job, pj.target, pj.profile or job["profile"], status,
            self.attempt(outcome, reason, started), size, self.worker, self.versions,
            int(time.time() * 1000),
            # Unique per attempt: the quarantine app counts distinct ids, so a replayed
            # event never counts twice (a retried job's next attempt is another event).
            f"{self._id_prefix}{next(self._ids):016x}", pj.egress)
        return self.enc.record(topic or self.topology.telemetry, pj.target, pj.key.encode(),
                               record)
