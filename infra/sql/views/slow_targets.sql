-- title: Slowest and most-blocked targets
-- The twenty targets that push back hardest in the window: most blocked first, then the
-- slowest (answer time of their requests, exact quantiles), with their retry rate beside.
SELECT target,
       uniqExact(event_id) AS requests,
       uniqExactIf(event_id, outcome = 'blocked') AS blocked,
       round(blocked / requests, 4) AS block_rate,
       round(uniqExactIf(event_id, outcome = 'retry') / requests, 4) AS retry_rate,
       quantileExact(0.5)(elapsed_ms) AS p50_ms,
       quantileExact(0.95)(elapsed_ms) AS p95_ms,
       max(elapsed_ms) AS max_ms
FROM fetch_events WHERE $__timeFilter(ts)
GROUP BY target ORDER BY block_rate DESC, p95_ms DESC, target
LIMIT 20
