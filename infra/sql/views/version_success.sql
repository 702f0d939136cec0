-- title: Success by version tuple
-- Success = a 2xx/3xx answer, per (fetcher, HTTP, TLS, profile bundle, code) version tuple.
SELECT fetcher_version, http_version, tls_version, profile_bundle_version, code_revision,
       uniqExact(event_id) AS requests,
       uniqExactIf(event_id, outcome = 'ok' AND status BETWEEN 200 AND 399) AS ok,
       uniqExactIf(event_id, outcome = 'blocked') AS blocked,
       round(ok / requests, 4) AS success_rate
FROM fetch_events WHERE $__timeFilter(ts)
GROUP BY fetcher_version, http_version, tls_version, profile_bundle_version, code_revision
ORDER BY requests DESC
