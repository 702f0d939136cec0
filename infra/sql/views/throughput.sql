-- title: Throughput per stage (records/s)
-- FINAL: a sample is keyed by (stage, topic, ts); one rewritten (a stop's last sample in
-- the same bucket) counts once, before and after the engine's merge (a small table).
-- Records each stage's group consumed per second (the rate of its committed offsets).
SELECT $__timeInterval(ts) AS time, stage, round(avg(rate), 2) AS records_per_s
FROM (
    SELECT ts, stage, sum(rate_per_s) AS rate
    FROM queue_samples FINAL WHERE $__timeFilter(ts) GROUP BY ts, stage
)
GROUP BY time, stage ORDER BY time, stage
