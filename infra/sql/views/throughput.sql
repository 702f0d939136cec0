-- title: Throughput per stage (records/s)
-- Records each stage's group consumed per second (the rate of its committed offsets).
SELECT $__timeInterval(ts) AS time, stage, round(avg(rate), 2) AS records_per_s
FROM (
    SELECT ts, stage, sum(rate_per_s) AS rate
    FROM queue_samples WHERE $__timeFilter(ts) GROUP BY ts, stage
)
GROUP BY time, stage ORDER BY time, stage
