"""Local web sites for the demo, the tests and the benchmarks, never product code: the demo
and benchmark sites of many shapes (``site_spec``, ``demo_pages`` (what ``crawlfleet demo``
crawls), ``bench_site``, ``shapes``, served by ``demo_server``; ``demo_site`` is the CLI), the
hostile site of traps (``hostile_site``), and the tests' behaviour and scripted sites. Each
serves on 127.0.0.0/8 only; nothing in the pipeline imports them."""
