-- title: Success by worker
-- Success = a 2xx/3xx answer; blocked, 404 and every error count against it.
SELECT worker, code_revision,
       uniqExact(event_id) AS requests,
       uniqExactIf(event_id, outcome = 'ok' AND status BETWEEN 200 AND 399) AS ok,
       uniqExactIf(event_id, outcome = 'blocked') AS blocked,
       round(ok / requests, 4) AS success_rate
FROM fetch_events WHERE $__timeFilter(ts)
GROUP BY worker, code_revision ORDER BY worker
