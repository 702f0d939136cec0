-- title: Revisits due and done per target
-- Issue 45. Due now: pages whose latest stored visit planned a next one (next_due_at) that
-- has passed, with no later visit stored and no dead letter of the page since it was due (a
-- revisit refused for good, by robots.txt say, is not coming); waiting_*: how long past due
-- they are. Planned: next visits not due yet. Done: revisits stored in the window, changed,
-- unchanged (the same text) or not modified (a 304); late_*: how long after its due time
-- each came (visited_at minus the next_due_at of the visit before it; revisits of visits
-- stored before the column was kept have no due time and are not counted there). Seconds.
WITH
    latest AS (
        SELECT dedupe_key, any(target) AS target, argMax(url, visit) AS url,
               argMax(next_due_at, visit) AS due_at
        FROM page_visits FINAL
        GROUP BY dedupe_key
        HAVING due_at > toDateTime64(0, 3, 'UTC')
    ),
    dead AS (
        SELECT url, max(failed_at) AS dead_at FROM dead_letters FINAL
        WHERE url IN (SELECT url FROM latest WHERE due_at <= now64(3))
        GROUP BY url
    ),
    waiting AS (
        SELECT target, due_at, dateDiff('millisecond', due_at, now64(3)) / 1000 AS wait_s
        FROM latest LEFT JOIN dead USING (url)
        WHERE ifNull(dead_at, toDateTime64(0, 3, 'UTC')) < due_at
    ),
    done AS (
        SELECT target, outcome,
               if(previous = visit - 1 AND due_at > toDateTime64(0, 3, 'UTC'),
                  dateDiff('millisecond', due_at, visited_at) / 1000, NULL) AS late_s
        FROM (
            SELECT target, visit, visited_at, outcome,
                   lagInFrame(visit, 1, 0) OVER w AS previous,
                   lagInFrame(next_due_at, 1, toDateTime64(0, 3, 'UTC')) OVER w AS due_at
            FROM page_visits FINAL
            WINDOW w AS (PARTITION BY dedupe_key ORDER BY visit
                         ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
        )
        WHERE visit > 0 AND $__timeFilter(visited_at)
    )
SELECT target,
       sum(due_now) AS due_now,
       max(waiting_p50_s) AS waiting_p50_s,
       max(waiting_max_s) AS waiting_max_s,
       sum(planned) AS planned,
       sum(done) AS done,
       sum(changed) AS changed,
       sum(unchanged) AS unchanged,
       sum(not_modified) AS not_modified,
       max(late_p50_s) AS late_p50_s,
       max(late_max_s) AS late_max_s
FROM (
    SELECT target,
           toUInt64(countIf(due_at <= now64(3))) AS due_now,
           if(due_now = 0, NULL, round(quantileExactIf(0.5)(wait_s, due_at <= now64(3)), 3))
               AS waiting_p50_s,
           if(due_now = 0, NULL, round(maxIf(wait_s, due_at <= now64(3)), 3)) AS waiting_max_s,
           toUInt64(countIf(due_at > now64(3))) AS planned,
           toUInt64(0) AS done, toUInt64(0) AS changed, toUInt64(0) AS unchanged,
           toUInt64(0) AS not_modified,
           CAST(NULL, 'Nullable(Float64)') AS late_p50_s,
           CAST(NULL, 'Nullable(Float64)') AS late_max_s
    FROM waiting GROUP BY target
    UNION ALL
    SELECT target, toUInt64(0), CAST(NULL, 'Nullable(Float64)'),
           CAST(NULL, 'Nullable(Float64)'), toUInt64(0),
           toUInt64(count()), toUInt64(countIf(outcome = 'changed')),
           toUInt64(countIf(outcome = 'unchanged')),
           toUInt64(countIf(outcome = 'not_modified')),
           round(quantileExact(0.5)(late_s), 3), round(max(late_s), 3)
    FROM done GROUP BY target
)
GROUP BY target ORDER BY due_now DESC, done DESC, target LIMIT 100
