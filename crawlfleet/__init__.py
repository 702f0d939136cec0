"""crawlfleet: a polite, fault-tolerant, distributed web-crawl pipeline on Kafka."""

__version__ = "0.1.0"
