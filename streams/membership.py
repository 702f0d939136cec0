"""How a stage holds its partitions: incremental (cooperative) assignment, co-partitioned topics.

Every stage's consumer is a static member with the ``cooperative-sticky`` assignor
(:func:`streams.io.consumer_conf`), so a rebalance hands each member only the partitions
that move. A stage whose inputs must share an owner per partition number subscribes to its
lead topic only (:meth:`schemas.topics.Topology.subscription`); :class:`Membership` adds the
followers' same-numbered partitions to every assignment and revocation, so the stage's
callbacks always see whole partition sets, already assigned (and still assigned while a
revocation callback runs, so it can commit their work first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from schemas.topics import Topology

#: A rebalance callback of a stage: it sees the full (expanded) partition set.
Callback = Callable[[Consumer, list[TopicPartition]], None]


class AssignmentReport(Protocol):
    """Where a worker says what it holds (its status file): ``crawl`` reads readiness
    from it instead of describing the group (a coordinator request that librdkafka may
    abort the process on when it times out, librdkafka#4605)."""

    def assigned(self, assignment: list[tuple[str, int]]) -> None: ...


class Membership:
    """The subscription of one stage, with its followers assigned alongside the lead topic."""

    def __init__(self, topology: Topology, stage: str) -> None:
        self.topics = topology.subscription(stage)
        self.followers = topology.followers(stage)

    @property
    def lead(self) -> str:
        """The input whose partitions the group assigns (the followers come with them)."""
        return self.topics[0]

    def expand(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The lead topic's partitions plus the same-numbered partition of every follower."""
        out = [TopicPartition(p.topic, p.partition) for p in partitions]
        for topic in self.followers:
            out += [TopicPartition(topic, p.partition) for p in partitions]
        return out

    def subscribe(self, consumer: Consumer, on_assign: Callback | None = None,
                  on_revoke: Callback | None = None, on_lost: Callback | None = None,
                  report: AssignmentReport | None = None) -> None:
        """Subscribe ``consumer``; the callbacks get expanded partition sets.

        Assigned partitions are added before ``on_assign`` runs (so it can pause them: a
        pause set before the assignment would not stick); revoked ones are removed after
        ``on_revoke``/``on_lost`` ran. ``report`` hears the consumer's assignment after
        every change (an empty assignment too: the member has joined).
        """
        # Kept from the callbacks' own partition sets: asking the consumer for its
        # assignment inside a callback that ``close()`` serves raises librdkafka's _DESTROY
        # as a non-exception object, which killed the thread that closed the consumer.
        held: set[tuple[str, int]] = set()

        def tell(parts: list[TopicPartition], gained: bool) -> None:
            tps = {(tp.topic, tp.partition) for tp in parts}
            if gained:
                held.update(tps)
            else:
                held.difference_update(tps)
            if report is not None:
                report.assigned(sorted(held))

        def assigned(c: Consumer, parts: list[TopicPartition]) -> None:
            full = self.expand(parts)
            c.incremental_assign(full)
            try:
                if on_assign is not None:
                    on_assign(c, full)
            finally:  # after the stage has marked what waits for its state (readiness)
                tell(full, gained=True)

        def revoked(c: Consumer, parts: list[TopicPartition]) -> None:
            full = self.expand(parts)
            try:
                if on_revoke is not None:
                    on_revoke(c, full)
            finally:
                c.incremental_unassign(full)
                tell(full, gained=False)

        def lost(c: Consumer, parts: list[TopicPartition]) -> None:
            full = self.expand(parts)
            try:
                handler = on_lost or on_revoke
                if handler is not None:
                    handler(c, full)
            finally:
                c.incremental_unassign(full)
                tell(full, gained=False)

        consumer.subscribe(self.topics, on_assign=assigned, on_revoke=revoked, on_lost=lost)


def group_share(admin: AdminClient, group: str, worker: str) -> tuple[int, int, int] | None:
    """(members, partitions ``worker`` holds, partitions all hold) of ``group``'s live
    membership: a worker's share of a fleet-wide cap. None while the group rebalances."""
    try:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=2)
    except (KafkaException, TimeoutError):
        return None
    if not desc.members:
        return None
    mine = total = 0
    for m in desc.members:
        parts = {tp.partition for tp in (m.assignment.topic_partitions
                                         if m.assignment else [])}
        total += len(parts)
        if m.client_id == worker:
            mine = len(parts)
    return len(desc.members), mine, total
