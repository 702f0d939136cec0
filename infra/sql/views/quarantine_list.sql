-- title: Quarantines (scope, target, identity, since when)
-- Each quarantine the quarantine app issued in the window: its scope (profile, egress or the
-- whole target), the target, the identity it retired (the profile or egress name; the
-- target itself for a pause), since when and until when, and whether it was second order.
SELECT scope, target, name AS identity, at AS since, until, second_order, blocks, reason
FROM quarantines FINAL
WHERE $__timeFilter(at)
ORDER BY since DESC, target, scope, identity
