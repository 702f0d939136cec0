"""The registry is the topology: every stage (the pipeline's own too) is declared with its
inputs, outputs and stores, the graph is drawn from those declarations, README shows what
is drawn, and a stage can write only what it declared."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import UndeclaredTopicError
from crawlfleet.fleet import Plan
from schemas.graph import draw, flows, unfed
from schemas.stages import (
    StageSpec,
    StoreDecl,
    TimerDecl,
    TopicDecl,
    all_specs,
    register_stage,
    stage_spec,
    stages,
    stages_where,
    unregister_stage,
)
from schemas.topics import Topology
from streams.io import Encoder

README = Path(__file__).resolve().parents[2] / "README.md"

AUDIT = StageSpec("audit", ("crawl.parsed",), "audit_mod:Audit",
                  outputs=("crawl.audit",),
                  stores=(StoreDecl("tallies", "crawl.audit.tallies", "CrawlJob"),),
                  timers=(TimerDecl("recheck", "crawl.audit.timers", "CrawlJob"),),
                  label="parsed→audit")


@pytest.fixture
def audit() -> Iterator[StageSpec]:
    register_stage(AUDIT, (TopicDecl("crawl.audit", "ParsedPage"),))
    try:
        yield AUDIT
    finally:
        unregister_stage("audit", ("crawl.audit",))


def test_readme_shows_the_graph_the_declarations_draw() -> None:
    block = re.search(r"```text\n(.*?)```", README.read_text().split(
        "### The topology, drawn from the declarations", 1)[1], re.S)
    assert block is not None
    assert block.group(1).rstrip("\n").splitlines() == draw()


def test_every_input_has_a_writer_and_every_output_is_declared() -> None:
    assert unfed() == []  # the frontier is fed by the publishers, control by operators
    names = {s.name for s in Topology().specs()}
    for spec in all_specs():
        assert set(spec.inputs) | set(spec.outputs) | set(spec.changelogs) <= names, spec.name


def test_the_pipeline_graph_has_its_main_path() -> None:
    by_topic = {f.topic: f for f in flows()}
    assert by_topic["crawl.frontier"].readers == ("fetch",)
    assert "publish" in by_topic["crawl.frontier"].writers
    assert by_topic["crawl.fetched"].writers == ("fetch",)
    assert by_topic["crawl.fetched"].readers == ("parse",)
    assert by_topic["crawl.parsed"].readers == ("store",)
    assert by_topic["crawl.retry.2s"].readers == ("retry",)
    assert by_topic["crawl.timers"].store == "retry.timers"
    assert by_topic["crawl.parked"].holds_work and not by_topic["crawl.seen"].holds_work


def test_a_registered_stage_is_drawn_planned_drained_and_counted(audit: StageSpec) -> None:
    lines = draw()
    assert any(re.search(r"parse ─▶ crawl\.parsed +─▶ store, audit$", line) for line in lines)
    assert any(re.search(r"audit ─▶ crawl\.audit +─▶ ·$", line) for line in lines)
    assert any("crawl.audit.timers" in line and "[audit.recheck store: holds work]" in line
               for line in lines)
    assert stages()[-1] == "audit"
    assert Plan().counts()["audit"] == 1
    topo = Topology(prefix="x.")
    # the drain check waits on its timers and stores that hold work; the topics exist
    assert topo.state_topics("audit") == ["x.crawl.audit.timers"]
    names = {s.name for s in topo.specs()}
    assert {"x.crawl.audit", "x.crawl.audit.tallies", "x.crawl.audit.timers"} <= names
    assert topo.spec("x.crawl.audit.timers").config["message.timestamp.type"] == \
        "LogAppendTime"
    assert topo.spec("x.crawl.audit.tallies").config["cleanup.policy"] == "compact"


def test_after_forgetting_a_stage_its_topics_are_gone(audit: StageSpec) -> None:
    unregister_stage("audit", ("crawl.audit",))
    names = {s.name for s in Topology().specs()}
    assert not {n for n in names if n.startswith("crawl.audit")}
    assert "audit" not in stages()
    register_stage(AUDIT, (TopicDecl("crawl.audit", "ParsedPage"),))  # for the fixture


def test_a_stage_cannot_declare_an_unknown_topic_or_take_a_pipeline_name() -> None:
    with pytest.raises(ValueError, match=r"undeclared topics crawl\.nowhere"):
        register_stage(StageSpec("lost", ("crawl.parsed",), "m:C", outputs=("crawl.nowhere",)))
    with pytest.raises(ValueError, match="already declared"):
        register_stage(StageSpec("fetch", ("crawl.parsed",), "m:C"))
    with pytest.raises(ValueError, match="pipeline's own"):
        unregister_stage("retry")
    assert "lost" not in stages()


def test_a_stage_writes_only_what_it_declares() -> None:
    topo = Topology(prefix="p.")
    enc = Encoder.of_stage(topo, "parse", "parse-0")
    with pytest.raises(UndeclaredTopicError, match=r"p\.crawl\.fetched"):
        enc.record(topo.fetched, "a.test", b"k", None)
    assert enc.record(topo.parsed, "a.test", b"k", None).topic == topo.parsed
    retry = Encoder.of_stage(topo, "retry", "retry-0")
    assert retry.record(topo.timers, "a.test", b"k", None).topic == topo.timers  # its store
    with pytest.raises(UndeclaredTopicError):
        retry.control("k", None)
    # a publisher's encoder (no stage) is unchecked
    assert Encoder(topo, "publisher").record(topo.fetched, "a.test", b"k", None).topic


def test_traits_are_read_from_the_declarations() -> None:
    assert stages_where("start_late") == ("retry", "revisit", "quarantine")
    assert stages_where("store_owner") == ("store",)
    assert stages_where("sends_requests") == ("fetch",)
    assert stage_spec("fetch").store_names == ("seen", "parked")
