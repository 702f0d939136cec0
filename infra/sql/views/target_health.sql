-- title: Block and retry rate per target
-- Requests per target by class: ok (2xx/3xx answers), blocked (the block outcome, never a
-- success), not_found (404: its own class), throttled (429 answers), errors (failed attempts
-- other than 429: connect errors, timeouts, 5xx), retries and dead; rates are per request.
-- Per egress and per profile: identity_health.
SELECT target,
       uniqExact(event_id) AS requests,
       uniqExactIf(event_id, outcome = 'ok' AND status BETWEEN 200 AND 399) AS ok,
       uniqExactIf(event_id, outcome = 'blocked') AS blocked,
       uniqExactIf(event_id, status = 404) AS not_found,
       uniqExactIf(event_id, outcome = 'retry') AS retries,
       uniqExactIf(event_id, outcome = 'dead') AS dead,
       uniqExactIf(event_id, status = 429) AS throttled,
       uniqExactIf(event_id, outcome IN ('retry', 'dead') AND status != 429) AS errors,
       round(blocked / requests, 4) AS block_rate,
       round(retries / requests, 4) AS retry_rate,
       round(throttled / requests, 4) AS throttle_rate,
       round(errors / requests, 4) AS error_rate,
       round(not_found / requests, 4) AS not_found_rate
FROM fetch_events WHERE $__timeFilter(ts)
GROUP BY target ORDER BY requests DESC
