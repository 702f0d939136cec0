"""An independent loss checker: what the site saw, what the store holds, what exists.

The pipeline's own counters (status files, gauges, committed offsets) say what the
pipeline believes it did; a checker that reads them can only agree with it. This one
shares no code with them. It compares three sources:

1. **reachable**: the URLs a correct crawler must reach, computed from the site generator
   itself (:meth:`sites.site_spec.SiteSpec.expected`: breadth-first over the generated
   links, robots.txt obeyed), never from what the crawl found;
2. **requests**: the site server's own request log (every URL asked for, how many times);
3. **the store**: ``pages`` raw and FINAL and ``dead_letters``, read through SQL.

URLs from every source are keyed by the site's canonical form (``canonical_url``, w3lib's
rules), not the pipeline's. The verdict: every reachable URL is stored exactly once (in
FINAL) or dead-lettered with a reason. ``lost`` is a reachable URL that is neither;
``final_duplicates`` a URL with more than one row in FINAL (should be impossible: FINAL
collapses a key); ``store_over_apply`` the raw rows beyond one per key (a batch inserted
twice under different tokens: over-apply at the store, collapsed later by merges, so the
count read is a lower bound of what happened); ``request_over_apply`` the page requests
beyond what each URL needs (one, plus a page's scripted transient failures).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.config import Settings
from infra.store_query import run_query
from sites.demo_server import DemoSite
from sites.site_spec import SiteSpec, canonical_url

#: How many URLs of each kind a verdict lists (the counts are always whole).
SAMPLE = 20


@dataclass(frozen=True)
class StoreRows:
    """The store's rows per canonical URL: ``final`` rows in ``pages FINAL``, ``raw`` rows
    and distinct keys in ``pages``, one stored ``status``, dead letters' reasons."""

    final: Mapping[str, int]
    raw: Mapping[str, int]
    raw_keys: Mapping[str, int]
    status: Mapping[str, int]
    dead: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class LossVerdict:
    reachable: int
    stored_once: int  # reachable URLs with exactly one row in FINAL
    dead_lettered: dict[str, int]  # reachable URLs dead-lettered (and not stored), by reason
    lost: tuple[str, ...]  # reachable URLs neither stored nor dead-lettered with a reason
    final_duplicates: dict[str, int]  # URL -> rows beyond one in FINAL
    store_over_apply: int  # raw rows beyond one per key, over every stored URL
    store_over_applied: dict[str, int]  # URL -> its raw rows beyond one per key
    unreachable_stored: tuple[str, ...]  # stored, but not reachable on the site
    unreachable_dead: dict[str, int]  # dead letters of unreachable URLs, by reason
    wrong_status: tuple[tuple[str, int, int], ...]  # (URL, expected, stored)
    stored_and_dead: tuple[str, ...]  # both a row and a dead letter (a replay, or a bug)
    stored_unrequested: tuple[str, ...]  # stored, yet the site never served it
    unreachable_requested: tuple[str, ...]  # requested, yet not reachable (robots!)
    page_requests: int  # requests the site received, robots.txt excluded
    requested_urls: int  # distinct page URLs requested
    request_over_apply: int  # requests beyond what each URL needs
    requests_per_url: dict[int, int]  # requests of one URL -> how many URLs got that many
    most_requested: tuple[tuple[str, int], ...]  # the URLs asked for most, beyond their need
    dead_without_reason: tuple[str, ...] = ()  # dead letters with an empty reason

    @property
    def lost_count(self) -> int:
        return len(self.lost)

    @property
    def duplicates(self) -> int:
        """Rows beyond one per URL in FINAL: what a reader of the store sees twice."""
        return sum(self.final_duplicates.values())

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing stored twice, nothing stored that does not exist."""
        return not self.lost_count and not self.duplicates and not self.unreachable_stored \
            and not self.stored_unrequested


def check(reachable: Mapping[str, int], requests: Mapping[str, int], store: StoreRows,
          needed_requests: Mapping[str, int] | None = None) -> LossVerdict:
    """The verdict from the three sources (all keyed by canonical URL).

    ``reachable`` maps each URL to the status the site answers it with; ``requests`` is the
    site's count per URL (robots.txt left out); ``needed_requests`` the requests a URL needs
    when it is more than one (a page scripted to fail transiently first).
    """
    needed = needed_requests or {}
    stored = {u for u, n in store.final.items() if n > 0}
    dead_with_reason = {u for u, reasons in store.dead.items() if any(reasons)}
    lost = sorted(u for u in reachable if u not in stored and u not in dead_with_reason)
    dead_by_reason: collections.Counter[str] = collections.Counter()
    unreachable_dead: collections.Counter[str] = collections.Counter()
    for url, reasons in store.dead.items():
        reason = next((r for r in reasons if r), "")
        if url in stored:
            continue
        if url in reachable:
            if reason:
                dead_by_reason[reason] += 1
        else:
            unreachable_dead[reason or "(no reason)"] += 1
    final_dupes = {u: n - 1 for u, n in store.final.items() if n > 1}
    over = {u: store.raw.get(u, 0) - store.raw_keys.get(u, 0) for u in store.raw}
    over = {u: n for u, n in over.items() if n > 0}
    wrong = tuple((u, reachable[u], store.status[u]) for u in sorted(stored)
                  if u in reachable and u in store.status and store.status[u] != reachable[u])
    extra = {u: n - needed.get(u, 1) for u, n in requests.items() if n > needed.get(u, 1)}
    per_url = collections.Counter(requests.values())
    most = sorted(extra.items(), key=lambda kv: (-kv[1], kv[0]))[:SAMPLE]
    return LossVerdict(
        reachable=len(reachable),
        stored_once=sum(1 for u in reachable if store.final.get(u, 0) == 1),
        dead_lettered=dict(sorted(dead_by_reason.items())),
        lost=tuple(lost),
        final_duplicates=dict(sorted(final_dupes.items())),
        store_over_apply=sum(over.values()), store_over_applied=dict(sorted(over.items())),
        unreachable_stored=tuple(sorted(stored - set(reachable))),
        unreachable_dead=dict(sorted(unreachable_dead.items())),
        wrong_status=wrong,
        stored_and_dead=tuple(sorted(stored & set(store.dead))),
        stored_unrequested=tuple(sorted(u for u in stored if not requests.get(u))),
        unreachable_requested=tuple(sorted(u for u in requests if u not in reachable)),
        page_requests=sum(requests.values()), requested_urls=len(requests),
        request_over_apply=sum(extra.values()),
        requests_per_url=dict(sorted(per_url.items())),
        most_requested=tuple(most),
        dead_without_reason=tuple(sorted(u for u, r in store.dead.items() if not any(r))),
    )


# --- the sources --------------------------------------------------------------------------


def reachable_of(spec: SiteSpec) -> dict[str, int]:
    """URL -> status of every page a correct crawler reaches, from the generator alone."""
    return {canonical_url(u): st for u, st in spec.expected().items()}


def needed_requests_of(spec: SiteSpec, urls: Iterable[str]) -> dict[str, int]:
    """Requests a URL needs beyond one: its page's scripted transient 503s, plus one."""
    out: dict[str, int] = {}
    for url in urls:
        host = _host_of(spec, url)
        page = spec.page(host, url[len(spec.url(host, "")):]) if host else None
        if page is not None and page.transient_503s:
            out[url] = 1 + page.transient_503s
    return out


def _host_of(spec: SiteSpec, url: str) -> str | None:
    for h in spec.hosts:
        if url.startswith(spec.url(h, "/")):
            return h
    return None


def requests_of(site: DemoSite) -> dict[str, int]:
    """Page requests per canonical URL from the site server's own log (robots.txt apart)."""
    counts, _ = site.snapshot()
    out: collections.Counter[str] = collections.Counter()
    for url, n in counts.items():
        if url.partition("?")[0].endswith("/robots.txt"):
            continue
        out[canonical_url(url)] += n
    return dict(out)


def store_rows(settings: Settings) -> StoreRows:
    """The store's rows per canonical URL, through SQL (the store process, when it runs)."""
    def q(sql: str) -> list[list[Any]]:
        return run_query(settings, sql)[1]

    final: collections.Counter[str] = collections.Counter()
    status: dict[str, int] = {}
    for url, n, st in q("SELECT url, count(), any(status) FROM pages FINAL GROUP BY url"):
        canon = canonical_url(str(url))
        final[canon] += int(n)
        status[canon] = int(st)
    raw: collections.Counter[str] = collections.Counter()
    raw_keys: collections.Counter[str] = collections.Counter()
    for url, n, keys in q("SELECT url, count(), uniqExact(dedupe_key) FROM pages GROUP BY url"):
        canon = canonical_url(str(url))
        raw[canon] += int(n)
        raw_keys[canon] += int(keys)
    dead: dict[str, tuple[str, ...]] = {}
    for url, reasons in q("SELECT url, groupArray(reason) FROM dead_letters FINAL "
                          "WHERE url != '' GROUP BY url"):
        canon = canonical_url(str(url))
        dead[canon] = dead.get(canon, ()) + tuple(str(r) for r in reasons)
    return StoreRows(final=dict(final), raw=dict(raw), raw_keys=dict(raw_keys),
                     status=status, dead=dead)


def check_run(spec: SiteSpec, site: DemoSite, settings: Settings) -> LossVerdict:
    """The verdict of one crawl of ``spec`` served by ``site`` into ``settings``' store."""
    reachable = reachable_of(spec)
    requests = requests_of(site)
    return check(reachable, requests, store_rows(settings),
                 needed_requests_of(spec, reachable))


# --- output -------------------------------------------------------------------------------


def verdict_lines(v: LossVerdict) -> list[str]:
    """The verdict as plain lines, for the console and the round's report file."""
    lines = [
        f"reachable URLs (from the site generator): {v.reachable}",
        f"stored exactly once (FINAL): {v.stored_once}",
        f"dead-lettered with a reason: {sum(v.dead_lettered.values())} "
        f"{_kv(v.dead_lettered)}",
        f"LOST (neither): {v.lost_count}" if v.lost_count else "lost: 0",
        f"duplicates in FINAL: {v.duplicates}",
        f"store over-apply (raw rows beyond one per key; merges shrink it): "
        f"{v.store_over_apply}",
        f"stored but unreachable: {len(v.unreachable_stored)}",
        f"stored but never requested: {len(v.stored_unrequested)}",
        f"dead letters of unreachable URLs: {_kv(v.unreachable_dead) or 0}",
        f"stored with another status than the site's: {len(v.wrong_status)}",
        f"stored and dead-lettered: {len(v.stored_and_dead)}",
        f"page requests (site log) / distinct URLs: {v.page_requests} / {v.requested_urls}",
        f"requests beyond need (request over-apply): {v.request_over_apply}",
        f"URLs by requests received: {_kv({str(k): n for k, n in v.requests_per_url.items()})}",
    ]
    if v.unreachable_requested:
        lines.append(f"requested but unreachable (robots or never linked): "
                     f"{len(v.unreachable_requested)}, e.g. {list(v.unreachable_requested[:5])}")
    for title, urls in (("lost", v.lost), ("unreachable stored", v.unreachable_stored),
                        ("stored unrequested", v.stored_unrequested),
                        ("duplicated in FINAL", tuple(v.final_duplicates)),
                        ("over-applied at the store", tuple(v.store_over_applied))):
        if urls:
            lines.append(f"{title}, e.g.: " + ", ".join(urls[:SAMPLE]))
    if v.most_requested:
        lines.append("most requested beyond need: " + ", ".join(
            f"{u} +{n}" for u, n in v.most_requested[:5]))
    return lines


def _kv(d: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in d.items())
