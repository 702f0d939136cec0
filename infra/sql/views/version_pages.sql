-- title: Pages stored by version tuple
-- Pages stored per version tuple of the worker that fetched them (each page once, by its
-- dedupe key; pages stored before pages carried the tuple show an empty one), and how many
-- were good (2xx).
SELECT concat('bundle=', profile_bundle_version, ';http=', http_version, ';tls=', tls_version,
              ';code=', code_revision) AS version_tuple,
       code_revision,
       uniqExact(dedupe_key) AS pages,
       uniqExactIf(dedupe_key, status BETWEEN 200 AND 299) AS good_pages,
       round(good_pages / pages, 4) AS good_rate
FROM pages WHERE $__timeFilter(stored_at)
GROUP BY profile_bundle_version, http_version, tls_version, code_revision
ORDER BY pages DESC
