"""The committed dashboards and PrometheusRule are exactly what the generator renders (drift check), and
the dashboards are well-formed: shared variables, every query scoped to them, every metric real."""

from __future__ import annotations

import importlib
import json
import re

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.utils import floatToGoString

import services.common.metrics as relay_metrics
from tools.dashboards import generate, panels
from tools.dashboards.panels import DEFAULT_SLO, SLO_CHOICES
from tools.dashboards.queries import all_queries, dashboard_queries, exemplar_queries

BOARDS = sorted(generate.DASHBOARD_DIR.glob("*.json"))
SCRAPE_LABELS = {"namespace", "pod", "job", "instance"}
# A metric name, but not the middle of a recording rule's name (relaygr:<name>:<operations>).
# Each service declares its own metrics, and services/affinity the routing metrics of every process that
# routes (router, trigger, retrieval stub); a dashboard may use any of them.
METRICS_MODULES = sorted(path.parent.name for path in (generate.REPO_ROOT / "services").glob("*/metrics.py"))
_METRIC = re.compile(r"(?<![:\w])((?:relaygr|grpc_server)_[a-z_]+)\b(?!:)")


def boards() -> list[dict]:
    return [json.loads(path.read_text()) for path in BOARDS]


def test_committed_files_match_the_generator():
    stale = generate.stale(generate.render())
    assert not stale, f"regenerate with `python -m tools.dashboards`: {stale}"


def test_one_file_per_dashboard_named_by_its_uid():
    assert [p.stem for p in BOARDS] == sorted(m.UID for m in generate.DASHBOARD_MODULES)
    assert all(board["uid"] == path.stem for board, path in zip(boards(), BOARDS, strict=True))


@pytest.mark.parametrize("board", boards(), ids=lambda b: b["uid"])
def test_dashboard_offers_datasource_namespace_pod_and_slo_variables(board):
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "pod", "slo"]
    assert variables["datasource"]["query"] == "prometheus"
    assert (
        variables["pod"]["multi"] and variables["pod"]["includeAll"] and variables["pod"]["allValue"] == ".*"
    )
    assert "$namespace" in variables["pod"]["query"]
    assert variables["slo"]["current"]["value"] == DEFAULT_SLO


@pytest.mark.parametrize("board", boards(), ids=lambda b: b["uid"])
def test_every_panel_queries_the_chosen_datasource_within_namespace_and_pods(board):
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            if target["expr"] == "vector($slo)":
                continue
            for selector in re.findall(r"\{[^}]*\}", target["expr"]):
                assert 'namespace="$namespace"' in selector and 'pod=~"$pod"' in selector, target["expr"]
                assert "job=" in selector, target["expr"]


def test_slo_choices_are_latency_bucket_boundaries():
    """SLO compliance reads the bucket whose `le` equals the SLO, so each choice must be a boundary."""
    boundaries = {floatToGoString(b) for b in relay_metrics.LATENCY_BUCKETS}
    assert set(SLO_CHOICES) <= boundaries and DEFAULT_SLO in SLO_CHOICES


def exported_series_names() -> set[str]:
    """Every series name the services' metrics modules export, with the suffixes of each metric type."""
    for module in METRICS_MODULES:
        importlib.import_module(f"services.{module}.metrics")
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith(("relaygr_", "grpc_server_"))
        for suffix in suffixes[family.type]
    }


def test_every_metric_in_dashboards_and_rules_is_exported():
    exported = exported_series_names()
    used = {name for query in all_queries() for name in _METRIC.findall(query.expr)}
    assert used, "no metric found in the queries"
    assert used <= exported, f"exported by no services/*/metrics.py: {used - exported}"


def test_the_query_list_covers_every_panel_target_and_recording_rule():
    targets = [t["expr"] for board in boards() for p in board["panels"] for t in p.get("targets", [])]
    variables = [v for board in boards() for v in board["templating"]["list"] if v["type"] == "query"]
    queries = all_queries()
    from_boards = [q for board in boards() for q in dashboard_queries(board)]
    assert len(from_boards) == len(targets) + len(variables)
    assert set(targets) <= {q.expr for q in queries}
    records = [
        r
        for g in yaml.safe_load(generate.RULES_FILE.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    ]
    assert {r["record"] for r in records} <= {q.expr for q in queries}
    assert {r["expr"] for r in records} <= {q.expr for q in queries}


# The histograms the services observe with the request's trace id as an exemplar
# (services/common/interceptor.py, services/ranker/dataplane.py, services/retrieval_stub/dataplane.py).
EXEMPLAR_HISTOGRAMS = {
    "grpc_server_handling_seconds",
    "relaygr_rank_latency_seconds",
    "relaygr_recommend_latency_seconds",
}
_QUANTILE = re.compile(r"^histogram_quantile\(([0-9.]+), .*?\(rate\(([a-z_]+)_bucket\{")


def test_p99_latency_panels_show_the_exemplars_that_link_to_traces():
    """Every time series P99 of a histogram that carries trace ids asks Grafana for its exemplars (the
    points a click turns into the slow request's trace); no other query does."""
    with_exemplars = set()
    for board in boards():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                match = _QUANTILE.match(target["expr"])
                expected = (
                    panel["type"] == "timeseries"
                    and match is not None
                    and float(match.group(1)) == 0.99
                    and match.group(2) in EXEMPLAR_HISTOGRAMS
                )
                assert target.get("exemplar", False) is expected, (
                    board["uid"],
                    panel["title"],
                    target["expr"],
                )
                if expected:
                    with_exemplars.add((board["uid"], panel["title"], match.group(2)))
    assert with_exemplars == {
        ("relaygr-fleet-overview", "Rank latency on the rankers", "grpc_server_handling_seconds"),
        ("relaygr-fleet-overview", "Rank queueing and model time", "relaygr_rank_latency_seconds"),
        ("relaygr-fleet-overview", "Rank P99 by cache source", "relaygr_rank_latency_seconds"),
        ("relaygr-fleet-overview", "Recommend latency", "relaygr_recommend_latency_seconds"),
        ("relaygr-trigger-router", "Admit latency", "grpc_server_handling_seconds"),
    }
    assert {q.expr for q in exemplar_queries()} == {
        t["expr"]
        for board in boards()
        for p in board["panels"]
        for t in p.get("targets", [])
        if t.get("exemplar")
    }


def test_the_histograms_with_exemplars_are_the_ones_the_services_label_with_trace_ids():
    exported = exported_series_names()
    assert {f"{name}_bucket" for name in EXEMPLAR_HISTOGRAMS} <= exported
    assert set(panels.EXEMPLAR_HISTOGRAMS) == EXEMPLAR_HISTOGRAMS


def panel_exprs(uid: str) -> dict[str, list[str]]:
    """Each panel of a committed dashboard, by title, with its targets' expressions."""
    board = json.loads(generate.dashboard_path(uid).read_text())
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in board["panels"] if p["type"] != "row"}


@pytest.mark.parametrize("board", boards(), ids=lambda b: b["uid"])
def test_panel_titles_are_unique_within_a_dashboard(board):
    """A query's source (dashboard, panel title, refId) names one target: the live checks key on it."""
    titles = [p["title"] for p in board["panels"] if p["type"] != "row"]
    assert len(titles) == len(set(titles)), titles


def test_metrics_modules_include_the_services_and_the_routing_library():
    assert {"common", "ranker", "trigger", "retrieval_stub", "affinity"} <= set(METRICS_MODULES)
    assert {"relaygr_router_decisions_total", "relaygr_router_member_healthy"} <= exported_series_names()


# Every Rank ends on a ranker, however it was routed: the retrieval stubs route theirs directly and only
# external callers go through the router, so the ranking SLO reads the rankers' gRPC handling of Rank.
RANKER_RANK = 'namespace="$namespace", pod=~"$pod", job="ranker", grpc_method="Rank"'


def test_rank_latency_and_slo_panels_measure_every_rank_on_the_rankers():
    exprs = panel_exprs("relaygr-fleet-overview")
    compliance = (
        f'sum (rate(grpc_server_handling_seconds_bucket{{{RANKER_RANK}, le="$slo"}}[$__rate_interval]))\n/\n'
        f"sum (rate(grpc_server_handling_seconds_count{{{RANKER_RANK}}}[$__rate_interval]))"
    )
    p99 = (
        "histogram_quantile(0.99, sum by (le) "
        f"(rate(grpc_server_handling_seconds_bucket{{{RANKER_RANK}}}[$__rate_interval])))"
    )
    assert exprs["Rank P99"] == [p99]
    assert exprs["Rank SLO compliance"] == [compliance]
    assert exprs["Rank latency on the rankers"] == [p99.replace("0.99", "0.5"), p99, "vector($slo)"]
    assert exprs["SLO compliance"][0] == compliance


def test_routing_panels_read_every_routing_process():
    """The trigger (PreInfer), the retrieval stub (Rank) and the router (external callers) all route and
    export the same series; each routing panel reads all three, per process where each keeps its own."""
    routing = 'namespace="$namespace", pod=~"$pod", job=~"trigger|retrieval-stub|router"'
    exprs = panel_exprs("relaygr-trigger-router")
    assert exprs["Routing decisions (trigger, stub, router)"] == [
        "sum by (job, method, decision) "
        f"(rate(relaygr_router_decisions_total{{{routing}}}[$__rate_interval]))"
    ]
    assert exprs["In flight per member (trigger, stub, router)"] == [
        f"sum by (job, member) (relaygr_router_inflight{{{routing}}})"
    ]
    assert exprs["Routable members (trigger, stub, router)"] == [
        f"min by (job, pod, member) (relaygr_router_member_healthy{{{routing}}})"
    ]
    routing_queries = [q for q in all_queries() if "relaygr_router_" in q.expr]
    assert routing_queries and all(routing in q.expr for q in routing_queries), routing_queries
    board = json.loads(generate.dashboard_path("relaygr-trigger-router").read_text())
    pod_jobs = {v["name"]: v["query"] for v in board["templating"]["list"]}["pod"]
    assert 'job=~"trigger|retrieval-stub|router|ranker"' in pod_jobs


def test_no_query_reads_the_router_alone():
    """The router sees only external callers' traffic, so no panel or rule is about it alone."""
    assert not [q for q in all_queries() if 'job="router"' in q.expr]
