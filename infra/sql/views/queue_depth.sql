-- title: Queue depth per stage
-- Records each stage's group has not committed yet (its lag, summed over its input topics),
-- sampled by the store worker every sample_interval_s and once more when it stops: the last
-- sample in each interval (so a drained crawl ends at 0), and the interval's peak beside it.
SELECT $__timeInterval(ts) AS time, stage, argMax(depth, ts) AS lag, max(depth) AS peak_lag,
       argMax(lagging, ts) AS partitions_behind
FROM (
    SELECT ts, stage, sum(lag) AS depth, sum(behind) AS lagging
    FROM queue_samples WHERE $__timeFilter(ts) GROUP BY ts, stage
)
GROUP BY time, stage ORDER BY time, stage
