"""The approved set folded from crawl.control: approvals add, tombstones revoke, and other
keys leave it alone."""

from __future__ import annotations

from schemas.records import Control
from streams.control import ControlState, approved_key, cap_key

T1 = "bundle=1;http=aiohttp/3.14.5;tls=OpenSSL 3;code=aaaaaaaaaaaa"
T2 = "bundle=1;http=aiohttp/3.14.5;tls=OpenSSL 3;code=bbbbbbbbbbbb"


def _approved(text: str) -> Control:
    return {"kind": "approved", "target": None, "value": None, "text": text,
            "issued_by": "ops"}


def test_approvals_add_and_tombstones_revoke() -> None:
    st = ControlState()
    assert st.approved == set()
    st.apply(approved_key(T1), _approved(T1))
    st.apply(approved_key(T2), _approved(T2))
    st.apply(approved_key(T1), _approved(T1))  # approving twice is one approval
    assert st.approved == {T1, T2}
    v = st.version
    st.apply(approved_key(T1), None)
    assert st.approved == {T2} and st.version > v  # readers notice the change
    st.apply(approved_key(T2), None)
    assert st.approved == set()  # revoking the last empties it: no enforcement


def test_the_key_carries_the_tuple_and_other_records_leave_the_set_alone() -> None:
    st = ControlState()
    st.apply(approved_key(T1), _approved("whatever the text says"))
    assert st.approved == {T1}  # the compacted key is the identity
    st.apply(approved_key(T2), {"kind": "cap", "target": None, "value": 1.0, "text": None,
                                "issued_by": "ops"})  # not an approval
    st.apply(cap_key("a.example"), {"kind": "cap", "target": "a.example", "value": 2.0,
                                    "text": None, "issued_by": "ops"})
    st.apply(approved_key(T2), None)  # revoking what was never approved
    assert st.approved == {T1} and st.caps == {"a.example": 2.0}
