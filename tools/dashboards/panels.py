"""Building blocks shared by the RelayGR dashboards: data source, variables, PromQL helpers and panels.

Every query selects `namespace="$namespace", pod=~"$pod"` and the `job` that exports the metric (the
PodMonitor sets `job` from the pod's app.kubernetes.io/name). Filtering by job matters: every service
imports the shared metrics module, so unlabelled relay metrics exist, at zero, on every pod.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.models import common, dashboard

FLEET_JOBS = ("ranker", "router", "trigger", "retrieval-stub")
DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE_WINDOW = "$__rate_interval"
# The SLO picker's choices must be bucket boundaries of the latency histograms, since SLO compliance
# reads the `le` bucket equal to the SLO.
SLO_CHOICES = ("0.02", "0.03", "0.05", "0.08", "0.1")
DEFAULT_SLO = "0.05"


def selector(job: str, *matchers: str) -> str:
    """`{namespace="$namespace", pod=~"$pod", job="<job>", ...}`; `job` with a `|` becomes a regex."""
    job_matcher = f'job=~"{job}"' if "|" in job else f'job="{job}"'
    return "{" + ", ".join(('namespace="$namespace"', 'pod=~"$pod"', job_matcher, *matchers)) + "}"


def fleet_jobs(*jobs: str) -> str:
    return "|".join(jobs or FLEET_JOBS)


def rate(metric: str, labels: str) -> str:
    return f"rate({metric}{labels}[{RATE_WINDOW}])"


def summed_rate(metric: str, labels: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} ({rate(metric, labels)})"


def quantile(q: float, histogram: str, labels: str, by: str = "") -> str:
    """The q-quantile of a histogram's buckets over the rate window, optionally per `by` labels."""
    grouping = ", ".join(filter(None, ("le", by)))
    return f"histogram_quantile({q}, sum by ({grouping}) ({rate(histogram + '_bucket', labels)}))"


def ratio(numerator: str, denominator: str, matching: str = "") -> str:
    """`numerator / denominator` on three lines (as Grafana's editor shows it), with optional matching."""
    operator = f"/ {matching}" if matching else "/"
    return f"{numerator}\n{operator}\n{denominator}"


# The latency histograms whose sampled observations carry their trace id as an OpenMetrics exemplar
# (`trace_id`, services/common/tracing.py): every service's gRPC handling time, the ranker's Rank latency
# and the retrieval stub's Recommend latency. A P99 target over one of them asks Grafana for the
# exemplars too, drawn as points a click turns into the slow request's trace (deploy/README.md, "Traces").
EXEMPLAR_HISTOGRAMS = (
    "grpc_server_handling_seconds",
    "relaygr_rank_latency_seconds",
    "relaygr_recommend_latency_seconds",
)


@dataclasses.dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and the legend of its series; `exemplar` also queries the exemplars
    of the histogram it reads (a P99 over one of EXEMPLAR_HISTOGRAMS)."""

    expr: str
    legend: str
    exemplar: bool = False


def p99_target(histogram: str, labels: str, legend: str = "P99", by: str = "") -> Target:
    """The P99 of a latency histogram, with its exemplars when the histogram carries trace ids."""
    return Target(quantile(0.99, histogram, labels, by=by), legend, exemplar=histogram in EXEMPLAR_HISTOGRAMS)


SLO_LINE = Target("vector($slo)", "SLO")


def _queries(targets: Sequence[Target]) -> list[prometheus.Dataquery]:
    queries = []
    for i, t in enumerate(targets):
        query = prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(t.expr).legend_format(t.legend).range()
        queries.append(query.exemplar(True) if t.exemplar else query)
    return queries


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dashboard_builders.ThresholdsConfig:
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(dashboard.ThresholdsMode.ABSOLUTE)
        .steps([dashboard.Threshold(value=value, color=color) for value, color in steps])
    )


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
    dashed: str = "",
) -> timeseries.Panel:
    """A time series panel; series whose name matches the regex `dashed` are drawn dashed (limits)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .fill_opacity(15 if stacked else 5)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
        .targets(_queries(targets))
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if dashed:
        panel = panel.override_by_regexp(
            dashed,
            [
                dashboard.DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
                dashboard.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
                dashboard.DynamicConfigValue(id_val="custom.stacking", value={"mode": "none"}),
            ],
        )
    return panel


def stat_panel(
    title: str,
    description: str,
    unit: str,
    target: Target,
    *,
    width: int = 6,
    height: int = 4,
    thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
) -> stat.Panel:
    """A single-value panel showing the last value of one query, coloured by `thresholds`."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .thresholds(_thresholds(thresholds))
        .targets(_queries([target]))
    )


def _variables(pod_jobs: str) -> list[cog.Builder[dashboard.VariableModel]]:
    fleet = f'job=~"{fleet_jobs()}"'
    return [
        dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dashboard_builders.QueryVariable("namespace")
        .label("Namespace")
        .datasource(DATASOURCE)
        .query(f"label_values(up{{{fleet}}}, namespace)")
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC),
        dashboard_builders.QueryVariable("pod")
        .label("Pod")
        .datasource(DATASOURCE)
        .query(f'label_values(up{{namespace="$namespace", job=~"{pod_jobs}"}}, pod)')
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dashboard.VariableOption(text="All", value="$__all")),
        dashboard_builders.CustomVariable("slo")
        .label("Ranking SLO (s)")
        .description("The ranking P99 SLO; the trigger's --slo-ms, in seconds.")
        .values(",".join(SLO_CHOICES))
        .current(dashboard.VariableOption(text=DEFAULT_SLO, value=DEFAULT_SLO)),
    ]


@dataclasses.dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[cog.Builder[dashboard.Panel]]


def build_dashboard(
    uid: str, title: str, description: str, pod_jobs: str, rows: Sequence[Row]
) -> dashboard.Dashboard:
    """A dashboard of `rows`, with the shared variables; `pod_jobs` limits the pod picker to those jobs."""
    board = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["relaygr"])
        .editable()
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone(common.TimeZoneBrowser)
        .variables(_variables(pod_jobs))
        .link(
            dashboard_builders.DashboardLink("RelayGR")
            .type(dashboard.DashboardLinkType.DASHBOARDS)
            .tags(["relaygr"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    panel_id = 0
    for row in rows:
        panel_id += 1
        board = board.with_row(dashboard_builders.Row(row.title).id(panel_id))
        for panel in row.panels:
            panel_id += 1
            board = board.with_panel(panel.id(panel_id))
    return board.build()


def latency_against_slo_panel(title: str, description: str, histogram: str, labels: str) -> timeseries.Panel:
    """P50 and P99 of a latency histogram, with the SLO drawn dashed (and the P99's exemplars, if any)."""
    targets = [Target(quantile(0.5, histogram, labels), "P50"), p99_target(histogram, labels), SLO_LINE]
    return timeseries_panel(title, description, "s", targets, dashed="SLO")
