"""A preview of the Grafana dashboard without Grafana: `docs/dashboard.png`.

Grafana cannot run where the docs are made, so this draws the dashboard's first rows
(packing, per pod, GPUs and exporters) with matplotlib. Titles, layout, units, legends,
line styles, thresholds and table columns come from the chart's dashboard JSON; the data
from a simulated cluster: half an hour of four H100s on two nodes, shared by up to twelve
fractional pods. Every 30 seconds of virtual time the simulation's readings and pods go
through the exporter's real collector and the scheduler's real metrics, and the
Prometheus text they write is parsed back, so every number carries a real metric name.
Each PromQL expression a drawn panel uses is evaluated by a hand-written Python
equivalent kept beside the expression's text; an expression without one stops the
script, so the preview cannot silently drift from the dashboard.

    python -m hack.dashboard_preview [--out docs/dashboard.png]

matplotlib is optional: pip install -e '.[docs]'.
"""

# The modules: `simulate` (the cluster and its scrapes), `promql` (the panels' queries,
# evaluated by hand), `draw` (matplotlib), `__main__` (the command).
