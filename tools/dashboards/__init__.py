"""Monitoring as code: the Grafana dashboards (grafana-foundation-sdk) and the PrometheusRule.

One module per dashboard (`fleet_overview`, `cache`, `trigger_router`) built from the shared pieces in
`panels`; `prometheus_rule` wraps deploy/monitoring/rules.yaml; `generate` renders every output and finds
drift; `queries.all_queries()` lists every PromQL query the committed dashboards and rules run.
"""
