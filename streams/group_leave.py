"""Removing a static member from its group at once (KIP-345's LeaveGroup by instance id).

A worker is a static member (its id is its ``group.instance.id``), and librdkafka sends no
LeaveGroup for a static member when its consumer closes: its partitions would stay with it
until the session timeout (30 s by default) while nobody consumes them. A worker that
leaves for good on purpose -- its version tuple revoked from the approved set -- therefore
asks the group coordinator itself to remove its instance, as the Java admin client's
``removeMembersFromConsumerGroup`` does (confluent-kafka's AdminClient has no such call):
LeaveGroup v3+ naming the instance, with an unknown member id. The group rebalances at once
and the partitions go to the members left.

Sent through aiokafka's protocol layer (installed with faust-streaming), which speaks the
same security settings as the workers' clients.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from typing import Any

from core.config import Settings
from core.errors import KafkaStageError

log = logging.getLogger("crawlfleet.membership")

#: The coordinator answered, but not in time: the member ages out with its session anyway.
LEAVE_TIMEOUT_S = 10.0
#: Kafka's "unknown member id": removal by ``group.instance.id`` alone (administrative).
UNKNOWN_MEMBER_ID = ""
#: Error codes of the LeaveGroup response (Kafka's protocol).
NO_ERROR, UNKNOWN_MEMBER, FENCED_INSTANCE = 0, 25, 82


@functools.cache
def _leave_request() -> Any:
    """The request class, built on first use: aiokafka (~30 ms of imports) is needed only
    when a worker leaves, and every stage process imports this module at start-up."""
    # aiokafka ships no type information: its protocol classes are Any to mypy.
    from aiokafka.protocol.api import (  # type: ignore[import-untyped]
        Request,
        RequestStruct,
        Response,
    )
    from aiokafka.protocol.types import (  # type: ignore[import-untyped]
        Array,
        Int16,
        Int32,
        Schema,
        String,
    )

    class LeaveGroupResponse_v3(Response):  # type: ignore[misc]  # (untyped base)
        API_KEY = 13
        API_VERSION = 3
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("error_code", Int16),
            ("members", Array(("member_id", String("utf-8")),
                              ("group_instance_id", String("utf-8")),
                              ("error_code", Int16))),
        )

    class LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]
        API_KEY = 13
        API_VERSION = 3
        RESPONSE_TYPE = LeaveGroupResponse_v3
        SCHEMA = Schema(
            ("group", String("utf-8")),
            ("members", Array(("member_id", String("utf-8")),
                              ("group_instance_id", String("utf-8")))),
        )

    class LeaveGroupByInstance(Request[LeaveGroupRequest_v3]):  # type: ignore[misc]
        """LeaveGroup for static members named by instance id (v3 is the first with them,
        and every broker since Kafka 2.4 takes it; 4.0 dropped v0-v2)."""

        API_KEY = 13

        def __init__(self, group: str, instances: list[str]) -> None:
            self.group = group
            self.instances = instances

        def build(self, request_struct_class: type[Any]) -> Any:
            return request_struct_class(
                self.group, [(UNKNOWN_MEMBER_ID, inst) for inst in self.instances])

    return LeaveGroupByInstance


def _client_conf(settings: Settings) -> dict[str, Any]:
    """aiokafka's spelling of the workers' connection settings."""
    common = settings.kafka_common()
    conf: dict[str, Any] = {"bootstrap_servers": common["bootstrap.servers"],
                            "client_id": "crawlfleet-leave", "request_timeout_ms": 10_000}
    protocol = str(common.get("security.protocol", "PLAINTEXT")).upper()
    conf["security_protocol"] = protocol
    if protocol in ("SSL", "SASL_SSL"):
        conf["ssl_context"] = ssl.create_default_context()
    if "sasl.mechanism" in common:
        conf["sasl_mechanism"] = common["sasl.mechanism"]
        conf["sasl_plain_username"] = common.get("sasl.username")
        conf["sasl_plain_password"] = common.get("sasl.password")
    return conf


async def _leave(settings: Settings, group: str, instance: str) -> int:
    from aiokafka.client import (  # type: ignore[import-untyped]
        AIOKafkaClient,
        CoordinationType,
    )
    client = AIOKafkaClient(**_client_conf(settings))
    try:
        await client.bootstrap()
        node = await client.coordinator_lookup(CoordinationType.GROUP, group)
        resp = await client.send(node, _leave_request()(group, [instance]))
        if resp.error_code != NO_ERROR:
            return int(resp.error_code)
        codes = [int(m[2]) for m in resp.members]
        return next((c for c in codes if c != NO_ERROR), NO_ERROR)
    finally:
        await client.close()


def leave_group(settings: Settings, group: str, instance: str) -> bool:
    """Remove static member ``instance`` from ``group`` now (call after its consumer
    closed). True if the coordinator removed it or it was already gone; False if the
    request failed (then the member ages out after the session timeout, as before)."""
    try:
        code = asyncio.run(asyncio.wait_for(_leave(settings, group, instance),
                                            LEAVE_TIMEOUT_S))
    except (OSError, TimeoutError, KafkaStageError) as exc:
        log.warning("%s: could not leave group %s at once (%s); its partitions move after "
                    "the session timeout", instance, group, exc)
        return False
    except Exception as exc:  # aiokafka's errors share no base with ours
        log.warning("%s: could not leave group %s at once (%s: %s); its partitions move "
                    "after the session timeout", instance, group, type(exc).__name__, exc)
        return False
    if code not in (NO_ERROR, UNKNOWN_MEMBER):
        log.warning("%s: the coordinator refused to remove it from %s (error %d); its "
                    "partitions move after the session timeout", instance, group, code)
        return False
    return True
