"""Frontier publishers: seeds in, canonical deduplicated CrawlJobs out."""
