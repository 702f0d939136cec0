-- title: Queue depth per stage
-- FINAL: a sample is keyed by (stage, topic, ts); one rewritten (a stop's last sample in
-- the same bucket) counts once, before and after the engine's merge (a small table).
-- Records each stage's group has not committed yet (its lag, summed over its input topics),
-- sampled by the store worker every sample_interval_s and once more when it stops: the last
-- sample in each interval (so a drained crawl ends at 0), and the interval's peak beside it.
SELECT $__timeInterval(ts) AS time, stage, argMax(depth, ts) AS lag, max(depth) AS peak_lag,
       argMax(lagging, ts) AS partitions_behind
FROM (
    SELECT ts, stage, sum(lag) AS depth, sum(behind) AS lagging
    FROM queue_samples FINAL WHERE $__timeFilter(ts) GROUP BY ts, stage
)
GROUP BY time, stage ORDER BY time, stage
