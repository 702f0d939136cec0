"""Each TypedDict of schemas.records matches the newest .avsc of its record, field by field.

Expected types are derived from the avsc JSON, never from the classes: a field added to one
side only, or a changed Avro type, fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import typing
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pytest

from schemas import records
from schemas.topics import Topology

SCHEMA_DIR = Path(records.__file__).parent
ROOT = Path(__file__).resolve().parents[2]
_PRIMITIVE: dict[str, Any] = {"string": str, "int": int, "long": int, "double": float,
                              "float": float, "boolean": bool, "bytes": bytes}


def _newest() -> dict[str, dict[str, Any]]:
    best: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in SCHEMA_DIR.glob("*.avsc"):
        m = re.match(r"^[a-z_]+\.v(\d+)\.avsc$", path.name)
        assert m, path.name
        raw = json.loads(path.read_text())
        if raw["name"] not in best or int(m[1]) > best[raw["name"]][0]:
            best[raw["name"]] = (int(m[1]), raw)
    return {name: raw for name, (_, raw) in best.items()}


def _expected(avro: Any) -> Any:
    if isinstance(avro, list):
        assert avro[0] == "null" and len(avro) == 2, avro  # only ["null", X] unions are used
        return _expected(avro[1]) | None
    if isinstance(avro, str):
        if avro in _PRIMITIVE:
            return _PRIMITIVE[avro]
        return getattr(records, avro.rsplit(".", 1)[-1])  # a named record: its TypedDict
    kind = avro["type"]
    if kind == "array":
        return list[_expected(avro["items"])]  # type: ignore[misc]
    if kind == "map":
        return dict[str, _expected(avro["values"])]  # type: ignore[misc]
    if kind == "enum":
        return Literal[tuple(avro["symbols"])]
    if kind == "record":
        return getattr(records, avro["name"])
    if avro.get("logicalType") == "timestamp-millis":
        assert kind == "long"
        return int | datetime
    return _expected(kind)


NEWEST = _newest()


def test_every_topology_record_has_a_typed_dict() -> None:
    names = {s.record for s in Topology().specs()}
    assert names <= set(NEWEST)
    assert set(records.RECORDS) == set(NEWEST) == names


@pytest.mark.parametrize("name", sorted(NEWEST))
def test_typed_dict_matches_newest_schema(name: str) -> None:
    cls = records.RECORDS[name]
    hints = typing.get_type_hints(cls)
    fields = {f["name"]: f["type"] for f in NEWEST[name]["fields"]}
    assert list(hints) == list(fields)  # same names, same order
    for field, avro in fields.items():
        assert hints[field] == _expected(avro), f"{name}.{field}"
    assert cls.__required_keys__ == frozenset(fields)  # type: ignore[attr-defined]


def test_a_mismatch_is_caught() -> None:
    assert _expected(["null", "string"]) != int | None
    assert _expected({"type": "array", "items": "string"}) != list[int]
    assert _expected({"type": "long", "logicalType": "timestamp-millis"}) is not int


_GOOD = """
    from confluent_kafka import Message

    from schemas.records import CrawlJob, FetchResult
    from schemas.topics import Topology
    from streams.io import Encoder

    enc = Encoder(Topology(), "test")
    job: CrawlJob = {"url": "https://example.com/", "target": "example.com",
                     "profile": "desktop", "depth": 0, "attempt": 0, "parent_url": None,
                     "last_error": None, "priority": 0, "meta": {}, "delay_ms": 0,
                     "pinned": True, "kind": "page", "visit": 0, "validators": {}}
    enc.job("crawl.frontier", job)
    enc.dead(job, None, "crawl.frontier", "internal", "boom", 1)


    def url_of(msg: Message) -> str:
        return enc.decode_as(FetchResult, msg)["job"]["url"]
"""

_BAD = """
    from confluent_kafka import Message

    from schemas.records import FetchResult
    from schemas.topics import Topology
    from streams.io import Encoder

    enc = Encoder(Topology(), "test")
    enc.job("crawl.frontier", {"url": "https://example.com/", "target": "example.com",
                               "profile": "desktop", "depth": 0, "attempt": 0,
                               "parent_url": None, "last_eror": None, "priority": 0,
                               "meta": {}, "delay_ms": 0, "pinned": True, "kind": "page",
                               "visit": 0, "validators": {}})


    def url_of(msg: Message) -> str:
        return enc.decode_as(FetchResult, msg)["job"]["ulr"]
"""


def test_mypy_checks_the_keys_of_records_the_stages_pass(tmp_path: Path) -> None:
    """The point of the TypedDicts: a misspelt key of a record handed to the Encoder, or read
    from a decoded one, is a mypy error (with the project's strict config), and a correct
    record is not."""
    (tmp_path / "good_records.py").write_text(textwrap.dedent(_GOOD))
    (tmp_path / "bad_records.py").write_text(textwrap.dedent(_BAD))
    mypy = Path(sys.executable).parent / "mypy"
    out = subprocess.run([str(mypy), "--config-file", str(ROOT / "pyproject.toml"),
                          "--cache-dir", str(tmp_path / "cache"),
                          str(tmp_path / "good_records.py"), str(tmp_path / "bad_records.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    report = out.stdout + out.stderr
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if "good_records.py" in e], report
    assert any('Extra key "last_eror"' in e and "[typeddict-unknown-key]" in e
               for e in errors), report
    assert any('Missing key "last_error"' in e for e in errors), report
    assert any('has no key "ulr"' in e and "[typeddict-item]" in e for e in errors), report
