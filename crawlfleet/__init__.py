"""crawlfleet: a polite, fault-tolerant, distributed web-crawl pipeline on Kafka."""

from core import __version__

__all__ = ["__version__"]
