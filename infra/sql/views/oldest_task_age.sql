-- title: Oldest waiting task per stage (s)
-- FINAL: a sample is keyed by (stage, topic, ts); one rewritten (a stop's last sample in
-- the same bucket) counts once, before and after the engine's merge (a small table).
-- Age of the oldest record a stage has not committed yet (0: nothing waiting).
SELECT $__timeInterval(ts) AS time, stage, max(oldest_age_s) AS oldest_age_s
FROM queue_samples FINAL WHERE $__timeFilter(ts)
GROUP BY time, stage ORDER BY time, stage
