"""The stream runtime every stage runs on. A stage (``stage``: identity, status, sessions
until stopped, a rejoin after a lost one) runs one of three session flavours: the batch
runtime (``batch_stage``: one transaction per poll batch), the asyncio runtime
(``async_session``: one Kafka thread under an event loop) and the sink runtime
(``sink_stage``: an idempotent write, then the offsets). Beneath them: partition-owned state
restored on assignment (``partition_restore``, ``restorer``) into changelog-backed stores
with one restore, checkpoint and TTL implementation (``state_store``); Kafka I/O and client
settings (``io``), the transactional commit (``committer``), partition ownership with
followers (``membership``), offsets and epochs (``offsets``, ``ledger``), slow start, the
control topic's reader, the frontier's back-pressure, broker time (``broker_time``), a
worker's id, stop and status, its metrics, and the fault hooks tests inject. The crawl logic
of each stage lives in ``consumers/`` and holds none of Kafka's plumbing.

faust-streaming analytics (windowed counters where at-least-once is safe) would live here
in a module of their own; none is used yet: every window the stages keep is exact and
in-process (``core.windows``)."""
