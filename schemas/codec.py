"""Registry-free Avro codec: fastavro schemaless bodies, writer fingerprint in a header.

Each record carries the CRC-64-AVRO fingerprint of its writer schema in the ``cf-schema``
header. Readers decode with that writer schema and resolve to the newest version they
know of the same record, so old records stay readable after a schema evolves (fields
added with defaults). Anything that fails is a :class:`DecodeError`, which stages turn
into a dead letter instead of a crash loop.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar, cast

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from core.errors import DecodeError
from schemas.topics import HEADER_SCHEMA

SCHEMA_DIR = Path(__file__).parent
_FILE_RE = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<version>\d+)\.avsc$")
# Load order matters: records that reference CrawlJob by name come after it.
_BASE_FIRST = ("crawl_job",)

#: Kafka record headers as confluent-kafka produces and returns them.
Headers = list[tuple[str, str | bytes | None]]
HeadersIn = Headers | dict[str, str | bytes | None] | None
#: A typed record: one of :mod:`schemas.records`' TypedDicts, named as its Avro record.
R = TypeVar("R", bound=Mapping[str, Any])


@dataclass(frozen=True)
class SchemaVersion:
    file_name: str
    record: str  # full record name, e.g. crawlfleet.CrawlJob
    version: int
    parsed: Any
    fingerprint: str


class Codec:
    """Encodes with the newest schema of a record; decodes any known version of it."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        self._by_fp: dict[str, SchemaVersion] = {}
        self._latest: dict[str, SchemaVersion] = {}
        #: Writer schemas of records embedding an older version of a base record (a
        #: FetchResult whose job is a v2 CrawlJob): decodable, never written, not versions.
        self._embedding_old: dict[str, SchemaVersion] = {}
        bases: list[SchemaVersion] = []
        for path in sorted(schema_dir.glob("*.avsc"), key=_load_order):
            m = _FILE_RE.match(path.name)
            if not m:
                continue
            sv = _load(path, m["name"], int(m["version"]), self._latest)
            self._by_fp[sv.fingerprint] = sv
            cur = self._latest.get(sv.record)
            if cur is None or sv.version > cur.version:
                self._latest[sv.record] = sv
            if m["name"] in _BASE_FIRST:
                bases.append(sv)
                continue
            for old in bases:  # so records in flight across a base record's upgrade decode
                if old is not self._latest[old.record]:
                    variant = _load(path, m["name"], int(m["version"]), self._latest, old)
                    if variant.fingerprint != sv.fingerprint:
                        self._embedding_old[variant.fingerprint] = variant

    def latest(self, record: str) -> SchemaVersion:
        return self._latest[_full(record)]

    def versions(self, record: str) -> list[SchemaVersion]:
        full = _full(record)
        return sorted((v for v in self._by_fp.values() if v.record == full),
                      key=lambda v: v.version)

    def encode(self, record: str, value: Mapping[str, Any],
               version: SchemaVersion | None = None) -> tuple[bytes, Headers]:
        """Serialize ``value`` with the newest (or the given) schema of ``record``."""
        sv = version or self.latest(record)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, sv.parsed, value)
        return buf.getvalue(), [(HEADER_SCHEMA, sv.fingerprint.encode())]

    def decode(self, record: str, payload: bytes | str | None,
               headers: HeadersIn) -> dict[str, Any]:
        """Decode a payload written with any known version of ``record``."""
        if payload is None:
            raise DecodeError(f"{record}: empty value")
        if isinstance(payload, str):
            payload = payload.encode()
        fp = _header(headers, HEADER_SCHEMA)
        if fp is None:
            raise DecodeError(f"{record}: missing {HEADER_SCHEMA} header")
        writer = self._by_fp.get(fp) or self._embedding_old.get(fp)
        if writer is None:
            raise DecodeError(f"{record}: unknown writer schema fingerprint {fp}")
        reader = self.latest(record)
        if writer.record != reader.record:
            raise DecodeError(f"{record}: record was written as {writer.record}")
        try:
            # Written with the newest schema (the usual case): nothing to resolve.
            result = fastavro.schemaless_reader(io.BytesIO(payload), writer.parsed,
                                                None if writer is reader else reader.parsed)
        except Exception as exc:  # fastavro raises assorted types on corrupt bytes
            raise DecodeError(f"{record}: corrupt payload ({type(exc).__name__}: {exc})") from exc
        if not isinstance(result, dict):
            raise DecodeError(f"{record}: payload is not a record")
        return result

    def decode_as(self, kind: type[R], payload: bytes | str | None, headers: HeadersIn) -> R:
        """:meth:`decode` as the record ``kind`` names (a TypedDict of
        :mod:`schemas.records`, named as its Avro record), typed so mypy checks its keys.

        The cast is the codec's word: the payload was read into ``kind``'s newest schema,
        which ``tests/unit/test_records.py`` holds equal to the TypedDict.
        """
        return cast(R, self.decode(kind.__name__, payload, headers))


def _load(path: Path, name: str, version: int, latest: dict[str, SchemaVersion],
          base: SchemaVersion | None = None) -> SchemaVersion:
    raw = json.loads(path.read_text())
    named: dict[str, Any] = {}
    # Make referenced records (the newest of each, or the given ``base`` version) resolvable;
    # ``base`` goes last, as a record embedding the newest would define it again.
    for sv in [*latest.values(), *([base] if base else [])]:
        fastavro.parse_schema(sv.parsed, named_schemas=named)
    parsed = fastavro.parse_schema(raw, named_schemas=named)
    # Fingerprint the expanded schema: with referenced records (CrawlJob) left as bare names,
    # records embedding different CrawlJob versions would share one fingerprint.
    canonical = to_parsing_canonical_form(fastavro.parse_schema(parsed, expand=True))
    return SchemaVersion(path.name, str(raw["namespace"]) + "." + str(raw["name"]), version,
                         parsed,
                         fingerprint(canonical, "CRC-64-AVRO"))


def _load_order(path: Path) -> tuple[int, str]:
    m = _FILE_RE.match(path.name)
    return (0 if m and m["name"] in _BASE_FIRST else 1, path.name)


def _full(record: str) -> str:
    return record if "." in record else f"crawlfleet.{record}"


def _header(headers: HeadersIn, name: str) -> str | None:
    pairs = headers.items() if isinstance(headers, dict) else (headers or ())
    for k, v in pairs:
        if k == name:
            # Not UTF-8: then no known fingerprint either, and decode says so.
            return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)
    return None


@lru_cache(maxsize=1)
def default_codec() -> Codec:
    """The process-wide codec over the schemas shipped in this package."""
    return Codec()
