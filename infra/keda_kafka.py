"""The metadata KEDA's ``kafka`` scaler accepts, and a check of a trigger against it.

KEDA's ScaledObject CRD takes any string keys under ``triggers[].metadata``: a misspelt
``lagTreshold`` validates, and KEDA then scales on its default threshold (10) -- a fleet
pinned at its maximum. So the keys and values are checked here against the scaler's own
parameter list: KEDA's docs (keda.sh/docs/2.22/scalers/apache-kafka/, "Parameter list")
and the ``keda:"name=..."`` tags of ``kafkaMetadata`` in kedacore/keda
``pkg/scalers/kafka_scaler.go`` (types, enums, defaults). Authentication parameters
(``sasl``, ``tls``, ``username`` ...) belong in a TriggerAuthentication, except the two the
scaler also reads from the metadata.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

INT, BOOL, TEXT, SERVERS, PARTITIONS = "int", "bool", "text", "servers", "partitions"

#: Every trigger-metadata key of the ``kafka`` scaler: its kind, or its allowed values.
KAFKA_TRIGGER_KEYS: dict[str, str | tuple[str, ...]] = {
    "bootstrapServers": SERVERS,  # required (or bootstrapServersFromEnv)
    "bootstrapServersFromEnv": TEXT,
    "consumerGroup": TEXT,  # required (or consumerGroupFromEnv)
    "consumerGroupFromEnv": TEXT,
    "topic": TEXT,  # optional: without it, every topic the group has offsets for
    "topicFromEnv": TEXT,
    "partitionLimitation": PARTITIONS,  # "1,2,10-20,31"; ignored without a topic
    "lagThreshold": INT,  # default 10: the average lag per replica
    "activationLagThreshold": INT,  # default 0
    "offsetResetPolicy": ("earliest", "latest"),  # default latest
    "allowIdleConsumers": BOOL,
    "excludePersistentLag": BOOL,
    "scaleToZeroOnInvalidOffset": BOOL,
    "limitToPartitionsWithLag": BOOL,  # needs a topic; not with allowIdleConsumers
    "ensureEvenDistributionOfPartitions": BOOL,  # needs a topic
    "version": TEXT,  # the Kafka protocol version sarama speaks, default 1.0.0
    "sasl": ("none", "plaintext", "scram_sha256", "scram_sha512", "oauthbearer", "gssapi"),
    "saslTokenProvider": ("bearer", "aws_msk_iam"),
    "awsRegion": TEXT,
    "tls": ("enable", "disable"),
    "unsafeSsl": BOOL,
}
REQUIRED = (("bootstrapServers", "bootstrapServersFromEnv"),
            ("consumerGroup", "consumerGroupFromEnv"))
_BOOLS = {"true", "false", "1", "0", "t", "f", "True", "False", "TRUE", "FALSE"}  # Go's ParseBool
_SERVER = re.compile(r"^[A-Za-z0-9.-]+:\d{1,5}$")
_PARTS = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def _value_problem(key: str, value: Any, kind: str | tuple[str, ...]) -> str | None:
    if not isinstance(value, str):
        return f"{key}: {value!r} is not a string (trigger metadata values are strings)"
    if isinstance(kind, tuple):
        return None if value in kind else f"{key}: {value!r} is not one of {', '.join(kind)}"
    ok = {INT: lambda v: re.fullmatch(r"-?\d+", v) is not None,
          BOOL: lambda v: v in _BOOLS,
          SERVERS: lambda v: all(_SERVER.match(s.strip()) for s in v.split(",")),
          PARTITIONS: lambda v: _PARTS.match(v.replace(" ", "")) is not None,
          TEXT: lambda v: bool(v.strip())}[kind](value)
    return None if ok else f"{key}: {value!r} is not a valid {kind}"


def kafka_trigger_problems(metadata: Mapping[str, Any]) -> list[str]:
    """What KEDA's kafka scaler would reject or silently ignore in ``metadata``."""
    out = [f"{k}: not a parameter of KEDA's kafka scaler" for k in metadata
           if k not in KAFKA_TRIGGER_KEYS]
    out += [p for k, v in metadata.items() if k in KAFKA_TRIGGER_KEYS
            if (p := _value_problem(k, v, KAFKA_TRIGGER_KEYS[k])) is not None]
    out += [f"one of {' / '.join(keys)} is required" for keys in REQUIRED
            if not any(k in metadata for k in keys)]
    if str(metadata.get("lagThreshold", "10")).lstrip("-").isdigit() \
            and int(metadata.get("lagThreshold", "10")) <= 0:
        out.append("lagThreshold must be positive")
    flags = {k for k in ("allowIdleConsumers", "limitToPartitionsWithLag",
                         "ensureEvenDistributionOfPartitions")
             if str(metadata.get(k, "false")).lower() in ("true", "1", "t")}
    if {"allowIdleConsumers", "limitToPartitionsWithLag"} <= flags:
        out.append("allowIdleConsumers and limitToPartitionsWithLag exclude each other")
    if "topic" not in metadata and flags & {"limitToPartitionsWithLag",
                                            "ensureEvenDistributionOfPartitions"}:
        out.append("limitToPartitionsWithLag / ensureEvenDistributionOfPartitions need a topic")
    return out
