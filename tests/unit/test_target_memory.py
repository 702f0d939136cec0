"""Bounded memory against a site that mints hosts: the scheduler forgets idle targets, the
robots.txt cache keeps at most its bound, and forgetting never loosens a cap or a
Crawl-delay (pure logic, a fake clock)."""

from __future__ import annotations

import asyncio

from consumers.fetch.robots_cache import RobotsCache
from consumers.fetch.scheduler import TargetScheduler


def _run(sched: TargetScheduler[str], target: str, now: float) -> None:
    sched.push(target, f"{target}/job", now)
    ((t, _),) = sched.pop_ready(now, 1)
    assert t == target
    sched.done(target, now)


def test_ten_thousand_minted_hosts_leave_at_most_the_bound() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda t: 1.0)
    for n in range(10_000):
        now = n * 0.01
        _run(sched, f"a{n}.mint.test", now)
        if n % 100 == 0:
            sched.evict_idle(now, idle_s=600.0, keep=500)
    sched.evict_idle(100.0, idle_s=600.0, keep=500)
    assert sched.slot_count <= 500


def test_a_target_with_work_or_a_pending_interval_is_never_forgotten() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda t: 10.0)
    _run(sched, "recent.test", 0.0)  # its next request is allowed at 10.0
    sched.push("queued.test", "job", 0.0)
    sched.push("busy.test", "job", 0.0)
    sched.pop_ready(0.0, 10)  # busy.test in flight (queued.test released too: push again)
    sched.push("queued.test", "job2", 0.0)
    sched.defer("deferred.test", 500.0)
    sched.push("held.test", "job", 0.0)
    sched.take("held.test")  # a slot with no work ...
    sched.hold("held.test")  # ... of a paused target
    gone = {t for t, _ in sched.evict_idle(5.0, idle_s=0.0, keep=0)}
    assert not gone & {"recent.test", "queued.test", "busy.test", "deferred.test",
                       "held.test"}
    # once its interval has passed and nothing waits, forgetting it loosens nothing
    assert "recent.test" in {t for t, _ in sched.evict_idle(11.0, idle_s=0.0, keep=0)}


def test_a_forgotten_target_starts_at_its_interval_not_faster() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda t: 2.0)
    _run(sched, "x.test", 0.0)
    assert sched.evict_idle(2.0, idle_s=0.0, keep=0) == [("x.test", 0.0)]
    sched.push("x.test", "a", 2.0)
    sched.push("x.test", "b", 2.0)
    assert [t for t, _ in sched.pop_ready(2.0, 5)] == ["x.test"]  # one now ...
    assert sched.pop_ready(3.9, 5) == []  # ... and the next one interval later
    assert [t for t, _ in sched.pop_ready(4.0, 5)] == ["x.test"]


def test_idle_for_long_is_forgotten_whatever_the_count() -> None:
    sched: TargetScheduler[str] = TargetScheduler(lambda t: 1.0)
    _run(sched, "old.test", 0.0)
    _run(sched, "new.test", 650.0)
    gone = sched.evict_idle(700.0, idle_s=600.0, keep=100)
    assert [t for t, _ in gone] == ["old.test"]


class RobotsFetcher:
    """A fetcher whose every robots.txt answers ``status`` with ``body``; counts asks."""

    def __init__(self, status: int = 200, body: bytes = b"User-agent: *\nCrawl-delay: 3\n"
                 ) -> None:
        self.asked: list[str] = []
        self.status, self.body = status, body

    async def get(self, url: str, **_: object) -> object:
        self.asked.append(url)
        return self


def test_the_robots_cache_keeps_at_most_its_bound_and_refetches_what_it_forgot() -> None:
    intervals: dict[str, float] = {}
    cache = RobotsCache("crawlfleet", 3600.0, lambda t, i: intervals.__setitem__(t, i),
                        max_origins=100)
    fetcher = RobotsFetcher()
    cache.fetcher = fetcher  # type: ignore[assignment]

    async def main() -> None:
        for n in range(1_000):
            assert await cache.rules_for(f"http://a{n}.mint.test/p", f"a{n}.mint.test") is None
            assert len(cache) <= 100
        # the newest are cached; a forgotten one is fetched again (and its delay set again)
        assert await cache.rules_for("http://a999.mint.test/p", "a999.mint.test") is not None
        cache.forget_target("a999.mint.test")
        intervals.clear()
        assert await cache.rules_for("http://a999.mint.test/p", "a999.mint.test") is None
        assert intervals == {"a999.mint.test": 3.0}

    asyncio.run(main())
    assert len(fetcher.asked) == 1_001


def test_forgetting_a_target_keeps_its_unreachable_robots_txt_until_its_retry_time() -> None:
    """Unreachable rules carry no Crawl-delay: dropping them with the target would only
    ask that origin again before its retry time."""
    cache = RobotsCache("crawlfleet", 3600.0, lambda t, i: None)
    fetcher = RobotsFetcher(503, b"")
    cache.fetcher = fetcher  # type: ignore[assignment]

    async def main() -> None:
        assert await cache.rules_for("http://down.test/p", "down.test") is None
        cache.forget_target("down.test")
        rules = cache.known("http://down.test/p")
        assert rules is not None and rules.unreachable
        assert await cache.rules_for("http://down.test/q", "down.test") is rules

    asyncio.run(main())
    assert fetcher.asked == ["http://down.test/robots.txt"]
