-- Dashboard views over the deduplicated tables. Query them with `crawlfleet sql`.
CREATE VIEW IF NOT EXISTS dash_pages_per_minute AS
SELECT toStartOfMinute(fetched_at) AS minute, countIf(status BETWEEN 200 AND 299) AS good_pages,
       count() AS pages
FROM pages FINAL GROUP BY minute ORDER BY minute;

CREATE VIEW IF NOT EXISTS dash_target_health AS
SELECT target, count() AS attempts, countIf(outcome = 'ok') AS ok,
       countIf(outcome = 'retry') AS retries, countIf(outcome = 'dead') AS dead,
       countIf(outcome = 'blocked') AS blocked,
       countIf(outcome = 'blocked' OR status IN (429, 503)) AS pushback,
       round(countIf(outcome = 'blocked' OR status = 429) / count(), 4) AS block_rate
FROM fetch_events FINAL GROUP BY target ORDER BY attempts DESC;

CREATE VIEW IF NOT EXISTS dash_dead_by_reason AS
SELECT reason, count() AS dead_letters, max(failed_at) AS last_seen
FROM dead_letters FINAL GROUP BY reason ORDER BY dead_letters DESC;

CREATE VIEW IF NOT EXISTS dash_worker_success AS
SELECT worker, fetcher_version, code_revision, count() AS attempts,
       round(countIf(outcome = 'ok' AND status BETWEEN 200 AND 399) / count(), 4) AS success_rate
FROM fetch_events FINAL GROUP BY worker, fetcher_version, code_revision ORDER BY worker;

CREATE VIEW IF NOT EXISTS dash_version_success AS
SELECT fetcher_version, http_version, tls_version, profile_bundle_version, code_revision,
       count() AS attempts, round(countIf(outcome = 'ok' AND status BETWEEN 200 AND 399) / count(), 4) AS success_rate
FROM fetch_events FINAL
GROUP BY fetcher_version, http_version, tls_version, profile_bundle_version, code_revision;

-- Per-stage job durations per hour (only fetch requests are timed: see crawlfleet doctor).
CREATE VIEW IF NOT EXISTS dash_job_durations AS
SELECT 'fetch' AS stage, toStartOfHour(ts) AS hour, count() AS jobs,
       quantileExact(0.5)(elapsed_ms) AS p50_ms, quantileExact(0.95)(elapsed_ms) AS p95_ms,
       quantileExact(0.99)(elapsed_ms) AS p99_ms, max(elapsed_ms) AS max_ms
FROM fetch_events FINAL
WHERE reason NOT IN ('robots_disallowed', 'robots_unreachable', 'address_not_allowed',
                     'invalid_url')
GROUP BY hour ORDER BY hour;
