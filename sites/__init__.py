"""Local web sites for the demo, the tests and the benchmarks, never product code: the demo
and benchmark site of many shapes (``demo_site``, what ``crawlfleet demo`` crawls), the
hostile site of traps (``hostile_site``), and the tests' behaviour and scripted sites. Each
serves on 127.0.0.0/8 only; nothing in the pipeline imports them."""
