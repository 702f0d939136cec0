-- title: Good pages per interval
-- Pages stored with a 2xx status (each dedupe key once, without a FINAL scan), and all pages.
SELECT $__timeInterval(stored_at) AS time,
       uniqExactIf(dedupe_key, status BETWEEN 200 AND 299) AS good_pages,
       uniqExact(dedupe_key) AS pages
FROM pages WHERE $__timeFilter(stored_at)
GROUP BY time ORDER BY time
