-- title: Block, error and 429 rates per target and identity
-- Which exit or profile a site dislikes (issue 41): each target's requests split by the egress
-- they went through (scope egress: direct or a proxy's name; '' for events stored before the
-- egress was kept) and, separately, by the profile they were sent as (scope profile). Blocked:
-- the block outcome; throttled: 429 answers; errors: other failed attempts (connect errors,
-- timeouts, 5xx, proxy errors), retried or dead.
SELECT target,
       ident.1 AS scope,
       ident.2 AS name,
       uniqExact(event_id) AS requests,
       uniqExactIf(event_id, outcome = 'blocked') AS blocked,
       uniqExactIf(event_id, status = 429) AS throttled,
       uniqExactIf(event_id, outcome IN ('retry', 'dead') AND status != 429) AS errors,
       round(blocked / requests, 4) AS block_rate,
       round(throttled / requests, 4) AS throttle_rate,
       round(errors / requests, 4) AS error_rate
FROM fetch_events
ARRAY JOIN [tuple('egress', egress), tuple('profile', profile)] AS ident
WHERE $__timeFilter(ts)
GROUP BY target, scope, name ORDER BY target, scope, block_rate DESC, requests DESC LIMIT 500
