-- title: Queue depth per stage
-- Records each stage's group has not committed yet (its lag, summed over its input topics),
-- sampled by the store worker every sample_interval_s; the largest sample in each interval.
SELECT $__timeInterval(ts) AS time, stage, max(lag) AS lag, max(behind) AS partitions_behind
FROM (
    SELECT ts, stage, sum(lag) AS lag, sum(behind) AS behind
    FROM queue_samples WHERE $__timeFilter(ts) GROUP BY ts, stage
)
GROUP BY time, stage ORDER BY time, stage
