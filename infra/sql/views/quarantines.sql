-- title: Quarantines and second-order retirements per target
-- One row per target that had quarantines in the window: how many the quarantine app issued
-- (profile, egress, target pause) and how many were second order -- an identity retired
-- within the quarantine window after a neighbour of the same kind on the same target was.
-- 0 on a site that blocks one profile; a site that blocks everything stays at <= 1 because
-- the target is paused once most of its profiles are out.
SELECT target,
       count() AS quarantines,
       countIf(second_order = 1) AS second_order,
       countIf(scope = 'profile') AS profiles,
       countIf(scope = 'egress') AS egresses,
       countIf(scope = 'target') AS target_pauses,
       min(at) AS first_at,
       max(at) AS last_at
FROM quarantines FINAL
WHERE $__timeFilter(at)
GROUP BY target
ORDER BY second_order DESC, quarantines DESC, target
