-- crawlfleet tables. Every table is a ReplacingMergeTree keyed by a semantic or
-- source-offset key, so a redelivered batch collapses; read through the *_v views (FINAL).
CREATE TABLE IF NOT EXISTS pages (
    dedupe_key     String,
    url            String,
    final_url      String,
    target         LowCardinality(String),
    profile        LowCardinality(String),
    depth          UInt16,
    status         UInt16,
    content_type   LowCardinality(String),
    title          String,
    text           String,
    links          Array(String),
    body_bytes     UInt32,
    fetched_at     DateTime64(3, 'UTC'),
    fetch_worker   LowCardinality(String),
    parse_worker   LowCardinality(String),
    stored_at      DateTime64(3, 'UTC') DEFAULT now64(3),
    parsed_at      DateTime64(3, 'UTC') DEFAULT 0,
    -- the version tuple of the worker that fetched the page (core/versions.py)
    profile_bundle_version LowCardinality(String) DEFAULT '',
    http_version           LowCardinality(String) DEFAULT '',
    tls_version            LowCardinality(String) DEFAULT '',
    code_revision          LowCardinality(String) DEFAULT ''
) ENGINE = ReplacingMergeTree(fetched_at)
ORDER BY dedupe_key
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS fetch_events (
    event_id               String,
    ts                     DateTime64(3, 'UTC'),
    url                    String,
    target                 LowCardinality(String),
    profile                LowCardinality(String),
    attempt                UInt16,
    status                 UInt16,
    outcome                LowCardinality(String),
    reason                 LowCardinality(String),
    elapsed_ms             UInt32,
    bytes                  UInt32,
    worker                 LowCardinality(String),
    fetcher_version        LowCardinality(String),
    http_version           LowCardinality(String),
    tls_version            LowCardinality(String),
    profile_bundle_version LowCardinality(String),
    code_revision          LowCardinality(String),
    egress                 LowCardinality(String) DEFAULT ''
) ENGINE = ReplacingMergeTree
ORDER BY (target, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS dead_letters (
    event_id       String,
    failed_at      DateTime64(3, 'UTC'),
    url            String,
    target         LowCardinality(String),
    profile        LowCardinality(String),
    source_topic   LowCardinality(String),
    reason         LowCardinality(String),
    error          String,
    attempts       UInt16,
    worker         LowCardinality(String),
    version        LowCardinality(String),
    raw            String,
    job            String DEFAULT ''
) ENGINE = ReplacingMergeTree
ORDER BY event_id
SETTINGS non_replicated_deduplication_window = 10000;

-- Queue depth over time, one row per (stage, input topic) and sample bucket, written by the
-- store worker's sampler (consumers/sampler.py).
CREATE TABLE IF NOT EXISTS queue_samples (
    ts             DateTime64(3, 'UTC'),
    stage          LowCardinality(String),
    topic          LowCardinality(String),
    lag            UInt64,
    consumed       UInt64,
    rate_per_s     Float64,
    behind         UInt16,
    oldest_age_s   Float64,
    sampler        LowCardinality(String)
) ENGINE = ReplacingMergeTree
ORDER BY (stage, topic, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- A store made before a column existed gains it (its older rows read the default).
-- job: the dead letter's whole CrawlJob as JSON (what `crawlfleet dlq replay` publishes again);
-- raw: the undecodable record's bytes as hex, whole.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS job String DEFAULT '';
ALTER TABLE pages ADD COLUMN IF NOT EXISTS parsed_at DateTime64(3, 'UTC') DEFAULT 0;
-- pages: the fetching worker's version tuple (rows stored before read as '').
ALTER TABLE pages ADD COLUMN IF NOT EXISTS profile_bundle_version LowCardinality(String) DEFAULT '';
ALTER TABLE pages ADD COLUMN IF NOT EXISTS http_version LowCardinality(String) DEFAULT '';
ALTER TABLE pages ADD COLUMN IF NOT EXISTS tls_version LowCardinality(String) DEFAULT '';
ALTER TABLE pages ADD COLUMN IF NOT EXISTS code_revision LowCardinality(String) DEFAULT '';
-- fetch_events: the egress of the attempt (direct or a proxy's name; '' before it was kept).
ALTER TABLE fetch_events ADD COLUMN IF NOT EXISTS egress LowCardinality(String) DEFAULT '';

-- Lineage: the job states no other table records (enqueued, duplicate, parked, released),
-- from crawl.lineage and from the links a parsed page enqueued (ParsedPage v4), keyed by the
-- job's dedupe key. `crawlfleet trace` joins them with fetch_events (attempts), pages
-- (parsed, stored) and dead_letters.
CREATE TABLE IF NOT EXISTS lineage (
    event_id       String,
    ts             DateTime64(3, 'UTC'),
    dedupe_key     String,
    url            String,
    target         LowCardinality(String),
    profile        LowCardinality(String),
    state          LowCardinality(String),
    attempt        UInt16,
    parent_url     String,
    detail         String,
    stage          LowCardinality(String),
    worker         LowCardinality(String),
    version        LowCardinality(String)
) ENGINE = ReplacingMergeTree
ORDER BY (dedupe_key, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

-- Quarantines the quarantine app issued (crawl.quarantines): one row per (target, scope,
-- name, at), where ``at`` is the event time of the block that triggered it, so the same
-- quarantine issued again by a replay (at-least-once) collapses. second_order: issued within
-- the window after a neighbour of the same kind on the same target was (a cascade).
CREATE TABLE IF NOT EXISTS quarantines (
    target         LowCardinality(String),
    scope          LowCardinality(String),
    name           LowCardinality(String),
    reason         String,
    at             DateTime64(3, 'UTC'),
    until          DateTime64(3, 'UTC'),
    second_order   UInt8,
    blocks         UInt16,
    event_id       String,
    app            LowCardinality(String),
    source         String
) ENGINE = ReplacingMergeTree
ORDER BY (target, scope, name, at)
SETTINGS non_replicated_deduplication_window = 10000;

-- Every visit of a page (issue 45): its first and each revisit, one row per (page, visit
-- number, crawl), so a redelivered batch collapses. outcome: new (a first visit), changed,
-- unchanged (a 200 with the last visit's text signature) or not_modified (a 304 to the
-- revisit's conditional GET; ``pages`` keeps the version before it). ``pages`` holds each
-- page's latest version; this table its history. next_due_at: when the page's next visit is
-- due, as the parse stage planned it (its clock at parse + the interval); 1970-01-01: none
-- (policy once, a failed visit, a row stored before the column).
CREATE TABLE IF NOT EXISTS page_visits (
    dedupe_key     String,
    visit          UInt32,
    url            String,
    target         LowCardinality(String),
    profile        LowCardinality(String),
    visited_at     DateTime64(3, 'UTC'),
    status         UInt16,
    outcome        LowCardinality(String),
    changed        UInt8,
    signature      String,
    etag           String,
    last_modified  String,
    stored_at      DateTime64(3, 'UTC') DEFAULT now64(3),
    next_due_at    DateTime64(3, 'UTC') DEFAULT 0,
    crawl          LowCardinality(String),
    parsed_at      DateTime64(3, 'UTC') DEFAULT 0,
    parse_worker   LowCardinality(String) DEFAULT ''
) ENGINE = ReplacingMergeTree(visited_at)
ORDER BY (dedupe_key, visit, crawl)
SETTINGS non_replicated_deduplication_window = 10000;
-- A store made before the column gains it (its older rows read 1970-01-01: no next visit).
ALTER TABLE page_visits ADD COLUMN IF NOT EXISTS next_due_at DateTime64(3, 'UTC') DEFAULT 0;

-- crawl: the topic prefix of the crawl that made the visit ('' the shared fleet's), so two
-- crawls of one store each keep their visits (each numbers them from 0); a replay of one
-- crawl still collapses. A store made before it gains it in place: a column added by the
-- same ALTER may extend the sorting key (no default expression allowed, hence none); its
-- older rows read ''. parsed_at, parse_worker: the visit's parse (`crawlfleet trace`).
ALTER TABLE page_visits ADD COLUMN IF NOT EXISTS crawl LowCardinality(String), MODIFY ORDER BY (dedupe_key, visit, crawl);
ALTER TABLE page_visits ADD COLUMN IF NOT EXISTS parsed_at DateTime64(3, 'UTC') DEFAULT 0;
ALTER TABLE page_visits ADD COLUMN IF NOT EXISTS parse_worker LowCardinality(String) DEFAULT '';

-- Replaced on every start: a view's * is expanded when it is made, so a view made before a
-- column was added would not show it.
CREATE OR REPLACE VIEW pages_v AS SELECT * FROM pages FINAL;
CREATE OR REPLACE VIEW fetch_events_v AS SELECT * FROM fetch_events FINAL;
CREATE OR REPLACE VIEW dead_letters_v AS SELECT * FROM dead_letters FINAL;
CREATE OR REPLACE VIEW lineage_v AS SELECT * FROM lineage FINAL;
CREATE OR REPLACE VIEW quarantines_v AS SELECT * FROM quarantines FINAL;
CREATE OR REPLACE VIEW page_visits_v AS SELECT * FROM page_visits FINAL;
