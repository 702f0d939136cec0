"""Operator commands find the crawl you mean; a crawl says how to resume it and what its
exit status means (issue 44). Pure logic: no broker."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.config import Settings
from crawlfleet.cli import EXIT_NOTHING_FETCHED, crawl_exit, resume_command
from crawlfleet.crawl import hold_data_dir
from crawlfleet.crawls import normal_prefix, pick_namespace, running_crawl
from crawlfleet.progress import paused_notes, starting_stages


def test_a_command_given_no_prefix_acts_on_the_crawl_running_on_its_data_dir(
        tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, topic_prefix="c1796609957-efecf9.")
    plain = Settings(data_dir=tmp_path)
    assert pick_namespace(plain, None).topic_prefix == ""  # nothing runs: the shared one
    with hold_data_dir(s):
        assert running_crawl(tmp_path)["topic_prefix"] == "c1796609957-efecf9."
        assert pick_namespace(plain, None).topic_prefix == "c1796609957-efecf9."
        # a name given wins, typed with or without its dot
        assert pick_namespace(plain, "c1-abcdef").topic_prefix == "c1-abcdef."
    # the lock file stays behind, but nobody holds it: no crawl runs
    assert json.loads((tmp_path / "crawl.lock").read_text())["topic_prefix"]
    assert running_crawl(tmp_path) is None
    assert pick_namespace(plain, None).topic_prefix == ""
    assert normal_prefix("") == "" and normal_prefix("a.") == "a."


def test_the_resume_command_repeats_the_options_given_and_names_the_prefix() -> None:
    cmd = resume_command("my seeds.txt", "c1-abcdef.",
                         {"--data-dir": Path("/d"), "--rate-cap": 1.0, "--scope": None},
                         ["--allow-private"])
    assert cmd == ("crawlfleet crawl 'my seeds.txt' --topic-prefix c1-abcdef. --data-dir /d "
                   "--rate-cap 1.0 --allow-private")


def _summary(**kw: Any) -> Any:
    base = {"interrupted": False, "drained": True, "pages_stored": 5, "seed_errors": 0,
            "topic_prefix": "c1-abcdef."}
    return SimpleNamespace(**{**base, **kw})


def test_exit_statuses_tell_drained_nothing_fetched_and_interrupted_apart() -> None:
    assert crawl_exit(_summary(), signal.SIGINT, "") == 0
    assert crawl_exit(_summary(seed_errors=1), signal.SIGINT, "") == 3
    assert crawl_exit(_summary(pages_stored=0), signal.SIGINT, "") == EXIT_NOTHING_FETCHED
    assert crawl_exit(_summary(drained=False), signal.SIGINT, "") == 1
    assert crawl_exit(_summary(drained=False, interrupted=True), signal.SIGINT, "x") == 130
    assert crawl_exit(_summary(drained=False, interrupted=True), signal.SIGTERM, "x") == 143


class _Proc:
    def __init__(self, pid: int, alive: bool = True) -> None:
        self.pid, self.alive = pid, alive

    def poll(self) -> int | None:
        return None if self.alive else 0


def test_a_stage_whose_worker_has_not_reported_yet_is_starting_not_stalled() -> None:
    fleet: Any = SimpleNamespace(procs={"fetch-0": _Proc(10), "store-0": _Proc(11),
                                        "parse-0": _Proc(12, alive=False)})
    # store-0 has written nothing yet; a stale status of an earlier run names another pid
    statuses = [{"stage": "fetch", "pid": 10}, {"stage": "store", "pid": 99}]
    assert starting_stages(fleet, statuses) == {"store"}


def test_a_paused_fetch_worker_shows_as_paused() -> None:
    assert paused_notes([{"stage": "fetch", "gauges": {"paused": 0}}]) == []
    assert paused_notes([{"stage": "fetch", "gauges": {"paused": 1}},
                         {"stage": "store", "gauges": {}}])[0].startswith("paused")


def test_a_client_error_reads_as_a_sentence_not_a_dump() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from crawlfleet.progress import kafka_reason
    exc = KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: down"))
    assert kafka_reason(exc) == "Failed to get metadata: down (_TRANSPORT)"
    assert "KafkaError{" not in kafka_reason(exc)
