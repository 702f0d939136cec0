-- title: Oldest waiting task per stage (s)
-- Age of the oldest record a stage has not committed yet (0: nothing waiting).
SELECT $__timeInterval(ts) AS time, stage, max(oldest_age_s) AS oldest_age_s
FROM queue_samples WHERE $__timeFilter(ts)
GROUP BY time, stage ORDER BY time, stage
