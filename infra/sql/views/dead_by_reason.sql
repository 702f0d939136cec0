-- title: Dead letters by reason
SELECT $__timeInterval(failed_at) AS time, reason, uniqExact(event_id) AS dead_letters
FROM dead_letters WHERE $__timeFilter(failed_at)
GROUP BY time, reason ORDER BY time, reason
