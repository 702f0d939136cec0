-- title: Visits per target
-- Every visit of a page (issue 45): first visits, and revisits changed, unchanged (the same
-- text signature) or not modified (a 304 to the conditional GET), with the share that changed.
SELECT target,
       countIf(outcome = 'new') AS first_visits,
       countIf(visit > 0) AS revisits,
       countIf(outcome = 'changed') AS changed,
       countIf(outcome = 'unchanged') AS unchanged,
       countIf(outcome = 'not_modified') AS not_modified,
       round(countIf(outcome = 'changed') / nullIf(countIf(visit > 0), 0), 3) AS change_rate
FROM page_visits FINAL WHERE $__timeFilter(visited_at)
GROUP BY target ORDER BY revisits DESC, first_visits DESC LIMIT 100
