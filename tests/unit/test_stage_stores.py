"""A stage's local state stores come from its declaration: the chaos state wipe finds
them where the stage keeps them, for built-in and declared stages alike."""

from __future__ import annotations

from pathlib import Path

from chaos.fault_plan import stateful_stages
from chaos.faults import state_dirs
from core.config import load_settings
from schemas.stages import StageSpec, StoreDecl, register_stage, unregister_stage
from streams.state_store import store_dir


def test_the_wipe_finds_each_declared_store_where_the_stage_keeps_it(tmp_path: Path) -> None:
    s = load_settings(data_dir=tmp_path, topic_prefix="c1-ab.")
    assert state_dirs(s, "fetch", "fetch-0") == [tmp_path / "seen" / "c1-ab" / "fetch-0",
                                                  tmp_path / "parked" / "c1-ab" / "fetch-0"]
    assert state_dirs(s, "retry", "retry-1") == [store_dir(s, "timers", "retry-1")]
    assert state_dirs(s, "revisit", "revisit-0") == [store_dir(s, "due", "revisit-0")]
    assert state_dirs(s, "parse", "parse-0") == []
    assert stateful_stages() == ("fetch", "retry", "revisit")


def test_a_declared_stage_with_a_store_is_wiped_too(tmp_path: Path) -> None:
    s = load_settings(data_dir=tmp_path)
    register_stage(StageSpec("tally", ("crawl.parsed",), "tally:Tally",
                             stores=(StoreDecl("counts", "tally.counts", "CrawlJob"),)))
    try:
        assert "tally" in stateful_stages()
        assert state_dirs(s, "tally", "tally-0") == [tmp_path / "counts" / "default" / "tally-0"]
    finally:
        unregister_stage("tally")
    assert "tally" not in stateful_stages()
