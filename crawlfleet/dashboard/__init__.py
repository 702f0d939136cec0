"""``crawlfleet dashboard``: the store's named views as charts and tables in a browser.

A loopback aiohttp server behind a token (:mod:`.guard`), answering only named panels over a
typed time window (:mod:`.params`, :mod:`.panels`), each the same SQL file that
``crawlfleet sql --view`` and the Grafana JSON run (:mod:`infra.views`), read through
:func:`infra.store_query.run_query` (:mod:`.data`). The page and its charting library
(uPlot, MIT, vendored with its licence in ``static/``) load nothing from the network.
"""
