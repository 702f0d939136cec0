"""Every pair of versions of a record is compatible both ways, as a Schema Registry checks.

``avro.compatibility`` runs the reader/writer check; a deliberately broken edit (a new field
without a default) must be reported incompatible, so the check itself can fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
_CRAWL_JOB = json.loads((SCHEMA_DIR / "crawl_job.v3.avsc").read_text())  # newest


def _versions() -> dict[str, list[tuple[int, dict[str, Any]]]]:
    by: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for path in SCHEMA_DIR.glob("*.avsc"):
        m = re.match(r"^([a-z_]+)\.v(\d+)\.avsc$", path.name)
        assert m
        by.setdefault(m[1], []).append((int(m[2]), json.loads(path.read_text())))
    return {k: sorted(v, key=lambda t: t[0]) for k, v in by.items() if len(v) > 1}


def _parse(raw: dict[str, Any]) -> avro.schema.Schema:
    names = avro.schema.Names()
    if raw["name"] != "CrawlJob":  # records reference CrawlJob by name
        avro.schema.make_avsc_object(_CRAWL_JOB, names)
    return avro.schema.make_avsc_object(raw, names)


def _compatible(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    result = ReaderWriterCompatibilityChecker().get_compatibility(_parse(reader), _parse(writer))
    return result.compatibility is SchemaCompatibilityType.compatible


PAIRS = [(name, old, new) for name, vs in _versions().items()
         for i, (_, new) in enumerate(vs) for _, old in vs[:i]]


def test_the_evolved_records_are_checked() -> None:
    assert {name for name, _, _ in PAIRS} == {"crawl_job", "parsed_page", "fetch_result",
                                              "telemetry"}


@pytest.mark.parametrize(("name", "old", "new"), PAIRS, ids=[p[0] for p in PAIRS])
def test_backward_and_forward(name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    assert _compatible(new, old), f"{name}: the new reader cannot read old records"
    assert _compatible(old, new), f"{name}: the old reader cannot read new records"


def test_a_new_field_without_default_is_incompatible() -> None:
    old = json.loads((SCHEMA_DIR / "parsed_page.v2.avsc").read_text())
    new = {**old, "fields": [*old["fields"], {"name": "lang", "type": "string"}]}
    assert not _compatible(new, old)  # backward broken: old records have no lang
    assert _compatible(old, new)  # forward still holds: the old reader ignores it
