"""The first mix's capacity against the SLO (`Mix.capacity`) and both modes' P99s at each mode's edge
(`Mix.edge_pairs`): report.md's section (its plot: `bench.report.plots`, capacity_vs_slo.png)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.lib.schema import EdgePair, Run, Sweep, ratio_interval
from bench.lib.schema_context import mix_phase
from bench.report.tables import table

CAPACITY_PLOT = "capacity_vs_slo.png"


@dataclass(frozen=True)
class CapacityRow:
    """Both modes' capacity on the first mix at one SLO multiple of u."""

    multiple: float
    slo_ms: float
    baseline: Sweep
    relay: Sweep
    headline: bool

    @property
    def ratio(self) -> float | None:
        if self.relay.best is None or not self.baseline.best:
            return None
        return round(self.relay.best / self.baseline.best, 3)

    @property
    def interval(self) -> list[float | None]:
        return ratio_interval(self.relay, self.baseline)


def capacity_rows(run: Run) -> list[CapacityRow]:
    """Every SLO multiple of the first mix, the headline's (its sweeps are the mix's own) among them, in
    increasing order; none for a run whose SLO was absolute."""
    unit, (_, mix) = run.measured.host_unit, run.first_mix
    if unit is None or unit.slo_u is None or not mix.capacity:
        return []
    label, _ = run.first_mix
    judged = run.measured.judged_slo_ms(mix_phase(label), unit.slo_ms)  # in the u its phase timed
    rows = [CapacityRow(unit.slo_u, judged, mix.baseline, mix.relay, True)]
    rows += [CapacityRow(c.multiple, c.slo_ms, c.baseline, c.relay, False) for c in mix.capacity.values()]
    return sorted(rows, key=lambda row: row.multiple)


def bracket(sweep: Sweep) -> str:
    """A mode's capacity as its bracket: the best load and the lowest failing one above it."""
    if sweep.best is None:
        return "none" + (f" (fails at {sweep.first_failure:g})" if sweep.first_failure is not None else "")
    above = "grid's end" if sweep.first_failure is None else f"{sweep.first_failure:g}"
    return f"{sweep.best:g} [{sweep.best:g}, {above})"


def interval_cell(row: CapacityRow) -> str:
    low, high = row.interval
    shown = f"[x{low:g}, {'unbounded' if high is None else f'x{high:g}'}]"
    return ("none" if row.ratio is None else f"x{row.ratio:g}") + f" {shown}"


def ms_or_failed(value: float | None) -> str:
    return "failed requests" if value is None else f"{value:g}"


def edge_row(pair: EdgePair) -> list[str]:
    difference, low, high = pair.difference_ms

    def signed(value: float | None) -> str:
        return "inf" if value is None else f"{value:+g}"

    return [
        pair.edge_of, f"{pair.rate:g}", str(len(pair.seeds)), ms_or_failed(pair.baseline_p99_ms),
        ms_or_failed(pair.relay_p99_ms), f"{signed(difference)} [{signed(low)}, {signed(high)}]",
    ]  # fmt: skip


def capacity_section(run: Run) -> str:
    """The capacity-against-SLO table, its plot, and the paired P99s at each mode's edge."""
    rows, (label, mix) = capacity_rows(run), run.first_mix
    parts = []
    if rows:
        parts += [
            f"## Capacity against the SLO (mix `{label}`)",
            "Each mode's highest load whose ranking P99 meets the SLO at several multiples of the host's "
            "unit u, with its bracket [best, lowest failing load above it); the ratio with the interval the "
            "two brackets give. The load sweeps ran at the largest multiple first and every smaller one "
            "reused their points; only the headline's multiple (marked) is refined between grid values.",
            table(
                ("SLO", "baseline req/s", "RelayGR req/s", "RelayGR / baseline"),
                [
                    (
                        f"{row.multiple:g} u = {row.slo_ms:g} ms" + (" (headline)" if row.headline else ""),
                        bracket(row.baseline),
                        bracket(row.relay),
                        interval_cell(row),
                    )
                    for row in rows
                ],
            ),
            f"![capacity against the SLO]({CAPACITY_PLOT})",
        ]
    if mix.edge_pairs:
        parts += [
            "### Both modes at each mode's edge",
            "At each mode's best load, both modes with the same users and arrivals (the load seeds its "
            "verdict pooled), every point run to its end: the P99 over the seeds pooled, and RelayGR's "
            "less the baseline's with its paired block-bootstrap 95 % interval.",
            table(
                ("edge of", "load req/s", "seeds", "baseline P99 ms", "RelayGR P99 ms", "difference ms"),
                [edge_row(pair) for pair in mix.edge_pairs],
            ),
        ]
    return "\n\n".join(parts)
