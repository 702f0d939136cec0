-- title: Queue depth per stage
-- Records each stage's group has not committed yet (its lag, summed over its input topics),
-- sampled by the store worker every sample_interval_s and once more when it stops: the last
-- sample in each interval (so a drained crawl ends at 0), and the interval's peak beside it.
SELECT $__timeInterval(ts) AS time, stage, argMax(lag, ts) AS lag, max(lag) AS peak_lag,
       argMax(behind, ts) AS partitions_behind
FROM (
    SELECT ts, stage, sum(lag) AS lag, sum(behind) AS behind
    FROM queue_samples WHERE $__timeFilter(ts) GROUP BY ts, stage
)
GROUP BY time, stage ORDER BY time, stage
