"""The stream runtime every stage runs on: Kafka I/O and client settings (``io``), the
transactional commit (``committer``), the batch stage loop (``batch_stage``), partition
ownership with followers (``membership``), offsets and epochs (``offsets``, ``ledger``),
changelog-backed state stores and their restores (``state_store``, ``restorer``), slow
start, the control topic's reader and the frontier's back-pressure, a worker's id, stop
and status, its metrics, and the fault hooks tests inject. The crawl logic of each stage
lives in ``consumers/`` and holds none of Kafka's plumbing.

faust-streaming analytics (windowed counters where at-least-once is safe) would live here
in a module of their own; none is used yet: every window the stages keep is exact and
in-process (``core.windows``)."""
