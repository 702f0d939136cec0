-- title: Success by version tuple
-- Did failures cluster on one version? Per version tuple (profile bundle, HTTP library, TLS
-- library, code revision; version_tuple is the string `crawlfleet approve` takes): requests,
-- successes (a 2xx/3xx answer), blocks, retries, dead letters, the success rate, and the
-- tuple's share of the window's failed requests beside its share of all requests (a share of
-- failures well above the share of requests is the clustering).
SELECT concat('bundle=', profile_bundle_version, ';http=', http_version, ';tls=', tls_version,
              ';code=', code_revision) AS version_tuple,
       fetcher_version, profile_bundle_version, http_version, tls_version, code_revision,
       uniqExact(event_id) AS requests,
       uniqExactIf(event_id, outcome = 'ok' AND status BETWEEN 200 AND 399) AS ok,
       uniqExactIf(event_id, outcome = 'blocked') AS blocked,
       uniqExactIf(event_id, outcome = 'retry') AS retries,
       uniqExactIf(event_id, outcome = 'dead') AS dead,
       requests - ok AS failed,
       round(ok / requests, 4) AS success_rate,
       round(requests / sum(requests) OVER (), 4) AS share_of_requests,
       round(if(sum(failed) OVER () = 0, 0, failed / sum(failed) OVER ()), 4) AS share_of_failures
FROM fetch_events WHERE $__timeFilter(ts)
GROUP BY fetcher_version, profile_bundle_version, http_version, tls_version, code_revision
ORDER BY requests DESC
