"""Which Kafka cluster a command uses, and whether it answers (a worker waits for its
broker instead: :func:`streams.worker.wait_for_kafka`)."""

from __future__ import annotations

from core.config import Settings
from core.errors import InfraError
from infra import kafka_local
from infra.broker_note import note_broker, noted_bootstrap
from streams.worker import kafka_answers


def resolve_bootstrap(settings: Settings, start_local: bool) -> Settings:
    """Use the configured cluster, or the local one (starting it if asked)."""
    if settings.bootstrap_servers:
        return settings
    st = kafka_local.status()
    if st.running:
        return settings.replace(bootstrap_servers=st.bootstrap_servers)
    noted = noted_bootstrap()  # the user's broker, started from another folder
    if noted:
        return settings.replace(bootstrap_servers=noted)
    if not start_local:
        raise InfraError("no Kafka configured and no local broker running: pass --bootstrap, "
                         "set CRAWLFLEET_BOOTSTRAP_SERVERS, or run `crawlfleet kafka up`")
    bootstrap = kafka_local.up()
    note_broker()
    return settings.replace(bootstrap_servers=bootstrap)


#: How long a one-shot command (publish, topics, top, pause, ...) waits for Kafka to answer
#: before it says it cannot reach it: a live broker answers in milliseconds.
REACH_TIMEOUT_S = 8.0


def reach_kafka(settings: Settings, timeout_s: float = REACH_TIMEOUT_S) -> Settings:
    """``settings`` on the cluster to use, once a broker of it answered within ``timeout_s``.

    One-shot commands call this first, so an unreachable broker is one clear error with its
    fix, not a minute of librdkafka retrying and a misleading result. Workers wait instead
    (:func:`streams.worker.wait_for_kafka`).
    """
    settings = resolve_bootstrap(settings, start_local=False)
    reason = kafka_answers(settings, timeout_s)
    if reason is not None:
        raise InfraError(f"cannot reach Kafka at {settings.bootstrap_servers} within "
                         f"{timeout_s:.0f} s ({reason}): start the local broker with "
                         "`crawlfleet kafka up`, or point --bootstrap (or "
                         "CRAWLFLEET_BOOTSTRAP_SERVERS) at a running cluster")
    return settings

