"""The control state folded from crawl.control: settings, and the parked backlog figures."""

from __future__ import annotations

from streams.control import (
    GLOBAL_PAUSE,
    ControlState,
    Quarantine,
    backlog_key,
    cap_key,
    pause_key,
    quarantine_key,
)


def _backlog(n: int) -> dict[str, object]:
    return {"kind": "backlog", "target": None, "value": float(n), "text": None,
            "issued_by": "fetch-0"}


def test_backlog_reports_sum_to_the_parked_jobs_the_frontier_bound_counts() -> None:
    st = ControlState()
    st.apply(backlog_key(0), _backlog(120))
    st.apply(backlog_key(3), _backlog(30))
    st.apply(backlog_key(0), _backlog(100))  # the latest count per partition is what holds
    assert st.parked == 130
    st.apply(backlog_key(3), None)  # drained partition: tombstone
    assert st.parked == 100
    st.apply(backlog_key(0), _backlog(0))
    assert st.parked == 0 and st.backlog == {}


def test_backlog_figures_are_not_setting_changes() -> None:
    """Workers re-derive holds when the version moves: a figure every commit must not."""
    st = ControlState()
    st.apply(backlog_key(1), _backlog(5))
    assert st.version == 0
    st.apply(pause_key("a.example"), {"kind": "pause", "target": "a.example", "value": None,
                                      "text": None, "issued_by": "ops"})
    st.apply(cap_key("b.example"), {"kind": "cap", "target": "b.example", "value": 0.5,
                                    "text": None, "issued_by": "ops"})
    assert st.version == 2
    assert st.target_paused("a.example") and st.caps == {"b.example": 0.5}
    assert not st.paused and GLOBAL_PAUSE == "pause:*"


def test_a_quarantine_holds_its_own_scope_only_until_it_ends() -> None:
    state = ControlState()
    q = Quarantine("profile", "a.example", "research", until_ms=10_000, reason="3 blocks")
    state.apply(quarantine_key("profile", "a.example", "research"), q.record("quarantine-0"))
    assert state.quarantined("profile", "a.example", "research", now_ms=9_999) == q
    assert state.quarantined("profile", "a.example", "research", now_ms=10_000) is None
    assert state.quarantined("profile", "b.example", "research", now_ms=0) is None
    assert state.quarantined("profile", "a.example", "other", now_ms=0) is None
    assert state.quarantined("egress", "a.example", "research", now_ms=0) is None
    state.apply(quarantine_key("profile", "a.example", "research"), None)  # lifted
    assert state.quarantined("profile", "a.example", "research", now_ms=0) is None


def test_an_unreadable_quarantine_record_states_nothing() -> None:
    state = ControlState()
    key = quarantine_key("egress", "a.example", "proxy-1")
    state.apply(key, {"kind": "quarantine", "target": "a.example", "value": 5.0,
                      "text": "not json", "issued_by": ""})
    state.apply(key, {"kind": "quarantine", "target": "a.example", "value": None,
                      "text": '{"scope": "egress", "name": "proxy-1"}', "issued_by": ""})
    assert state.quarantines == {}
