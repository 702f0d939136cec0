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
    stored_at      DateTime64(3, 'UTC') DEFAULT now64(3)
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
    code_revision          LowCardinality(String)
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
    raw            String
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

CREATE VIEW IF NOT EXISTS pages_v AS SELECT * FROM pages FINAL;
CREATE VIEW IF NOT EXISTS fetch_events_v AS SELECT * FROM fetch_events FINAL;
CREATE VIEW IF NOT EXISTS dead_letters_v AS SELECT * FROM dead_letters FINAL;
