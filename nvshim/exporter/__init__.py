"""``nvshim exporter``: Prometheus metrics of a GPU node, gathered at scrape time.

Nothing is added to the runtime's hot path: container counts come from tailing the
decision log (:mod:`nvshim.exporter.logtail`), the rest from the doctor's checks, the MPS
daemons' status and the CDI spec files (:mod:`nvshim.exporter.collector`).
"""
