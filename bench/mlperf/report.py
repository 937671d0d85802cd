"""summary.md of a LoadGen run and of a search, and the one-line description the command prints.

Every page says what the figures are not: synthetic weights and users, an MLPerf-shaped protocol run by
MLCommons LoadGen, not an MLPerf submission.
"""

from __future__ import annotations

from collections.abc import Iterable

from bench.lib.schema import Percentiles
from bench.mlperf.results import ModeSearch, RunResult, SearchResult
from services.common.contract import CACHE_SOURCES

CAVEAT = (
    "Synthetic weights and users, MLCommons LoadGen driving this fleet: not an MLPerf submission, and not "
    "comparable with MLPerf results."
)
CRITICAL_PATH_NOTE = (
    "History on the critical path: the long-term events each Rank computed itself (its answer's "
    "computed_prefix_events: all of them on a MISS, the appended ones of an extension it started, 0 for a "
    "prefix found in HBM, reloaded from DRAM or joined, a MISS that joined a concurrent Rank's computation "
    "included) plus the short-term events every Rank computes, as a share of the ranked answers' long-term "
    "+ short-term events. Prefix wait: how long a Rank waited for its long-term prefix (prefix_wait_ms); "
    "for HBM, a relayed Rank's wait for a pre-inference still running (bench.mlperf.tally)."
)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def shown(runs: Iterable[RunResult]) -> list[str]:
    """The cache sources the tables show, in the enum's order: those any of `runs` tallied (every run
    tallies HBM, DRAM, extended and miss; a peer only where one answered)."""
    tallied = {tier for run in runs for tier in run.tiers.counts}
    return [tier for tier in CACHE_SOURCES if tier in tallied]


def _rates(run: RunResult, tiers: list[str], separator: str = " | ", named: bool = False) -> str:
    rates = run.tiers.rates
    return separator.join(f"{tier + ' ' if named else ''}{_pct(rates.get(tier, 0.0))}" for tier in tiers)


def _verdict(run: RunResult) -> str:
    return "VALID" if run.valid else f"INVALID ({why_invalid(run)})"


def describe(result: RunResult) -> str:
    """One line: the verdict, LoadGen's P99 and throughput, failures and hit rates."""
    s, lg = result.settings, result.loadgen
    return (
        f"{s.mode:<8} {s.scenario} {s.target_qps:g} qps: {_verdict(result)}, P99 {_ms(lg.p99_ms)} ms, "
        f"{lg.samples_per_s} samples/s, {result.completed}/{lg.issued_samples} completed, {result.failed} "
        f"failed; {_rates(result, shown([result]), ' · ', named=True)}"
    )


def run_markdown(result: RunResult) -> str:
    """The summary.md of one run."""
    s, lg, t, h, w = result.settings, result.loadgen, result.tiers, result.history, result.prefix_wait_ms
    checks = {
        "performance constraints (P99)": lg.performance_constraints,
        "min duration": lg.min_duration,
        "min queries": lg.min_queries,
        "early stopping": lg.early_stopping,
    }
    window = "" if s.relay_window_ms is None else f" (relay window {s.relay_window_ms:g} ms inside it)"
    target = f"- target P99 {s.p99_target_ms:g} ms over the whole Recommend{window}"
    every = f"- {s.scenario}: every sample at once (at most {s.max_in_flight} in flight), no latency target"
    lines = [
        f"# LoadGen {s.scenario}: {s.mode}, target {s.target_qps:g} QPS",
        "",
        CAVEAT,
        "",
        f"- **{'VALID' if result.valid else 'INVALID'}** (LoadGen: {lg.result}; "
        + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in checks.items() if ok is not None)
        + f"; {result.failed} of {result.completed} calls failed"
        + (f": {_counts(result.error_codes)})" if result.error_codes else ")"),
        target if s.scenario == "Server" else every,
        f"- LoadGen: P50 {_ms(lg.p50_ms)} ms, P90 {_ms(lg.p90_ms)} ms, **P99 {_ms(lg.p99_ms)} ms**, "
        f"max {_ms(lg.max_ms)} ms; {lg.samples_per_s} samples/s"
        + ("" if lg.scheduled_per_s is None else f" ({lg.scheduled_per_s} scheduled)")
        + f"; {lg.issued_samples} samples issued, {result.completed} completed",
        f"- Rank through the router, as the stub timed it: P50 {_ms(result.rank_ms.p50)} ms, "
        f"P99 {_ms(result.rank_ms.p99)} ms",
        f"- users: {s.users} in the QSL, {result.distinct_users} visited, {result.visits_per_user} visits "
        f"each on average; mean long-term length {h.mean_long_term}",
        "",
        "| tier | all Ranks | later visits of a user | history on the critical path | "
        "prefix wait P50 / P99, ms |",
        "|---|---|---|---|---|",
        *(
            f"| {tier} | {t.counts.get(tier, 0)} ({_pct(t.rates.get(tier, 0.0))}) | "
            f"{t.later_counts.get(tier, 0)} ({_pct(t.later_rates.get(tier, 0.0))}) | "
            f"{h.computed_by_tier.get(tier, 0)} of {h.tokens_by_tier.get(tier, 0)} "
            f"({_pct(h.computed_share_by_tier.get(tier, 0.0))}) | {_waits(w.by_tier.get(tier))} |"
            for tier in shown([result])
        ),
        f"| ranked | {t.ranked} | {t.later_visits} | {h.computed} of {h.tokens} ({_pct(h.computed_share)}) | "
        f"{_waits(w.all)} |",
        "",
        f"Miss reasons: {_counts(t.miss_reasons)}. Admitted (pre-inference fired): {t.admitted}.",
        "",
        f"History computed on the Ranks' critical paths: {h.computed} of {h.tokens} events "
        f"(**{_pct(h.computed_share)}**): {h.computed_prefix} long-term events the Ranks computed themselves "
        f"+ {h.computed_short_term} short-term events ({h.short_term} a Rank); EXTENDED Ranks computed "
        f"{'—' if h.extended_computed_mean is None else h.extended_computed_mean} long-term events each on "
        f"average. HBM Ranks that waited over 1 ms for a pre-inference still running: {w.hbm_over_1ms} of "
        f"{t.counts.get('hbm', 0)}. {CRITICAL_PATH_NOTE}",
        "",
    ]
    return "\n".join(lines)


def _waits(waits: Percentiles | None) -> str:
    return "—" if waits is None or waits.p50 is None else f"{_ms(waits.p50)} / {_ms(waits.p99)}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counts.items())) or "none"


def search_markdown(search: SearchResult) -> str:
    """The summary.md of a search: the highest VALID target QPS per mode, then every run."""
    c = search.configuration
    preset = c["model_preset"] if "model_preset" in c else c["preset"]  # `preset` before the flags matched
    tiers = shown(run for mode in search.modes.values() for run in mode.runs)
    u = search.host_unit_ms  # where the search timed it
    unit = u and f"{c['p99_ms'] / u:.2f} u (the host's unit u = {u:g} ms: the full pass of `{preset}`"
    lines = [
        f"# LoadGen Server search: highest VALID target QPS at P99 ≤ {c['p99_ms']:g} ms",
        "",
        CAVEAT,
        "",
        *([f"MLPerf's P99 target is absolute; on this host it is {unit} at 2048 events).", ""] if u else []),
        f"{preset}, {c['rankers']} rankers, relay window {c['relay_window_ms']:g} ms, streaming users "
        f"(long-term median {c['history_median']}, cap {c['history_max']}, {c['growth_events_per_min']:g} "
        f"new events a minute, {c['visits_per_user']:g} visits a user), at least {c['min_query_count']} "
        f"queries and {c['duration_s']:g} s a run; {search.wall_s / 60:.1f} minutes, commit "
        f"{search.git_commit}, {search.cores} cores, load average {search.load_average_start[0]:g} at the "
        f"start and {search.load_average_end[0]:g} at the end.",
        "",
        f"| mode | highest VALID QPS | P99 there, ms | Rank P99, ms | {' | '.join(tiers)} | "
        "history on the critical path | prefix wait P50 / P99, ms | HBM prefix wait P50 / P99, ms |",
        "|---" * (7 + len(tiers)) + "|",
        *(_best_row(mode, tiers) for mode in search.modes.values()),
        "",
        "Every run, in the order measured:",
        "",
        "| mode | target QPS | verdict | P99 ms | max ms | samples/s | failed | "
        f"{' | '.join(tiers)} | critical path | prefix wait P99 ms |",
        "|---" * (9 + len(tiers)) + "|",
        *(_run_row(run, tiers) for mode in search.modes.values() for run in mode.runs),
        "",
        CRITICAL_PATH_NOTE,
        "",
    ]
    return "\n".join(lines)


def _best_row(mode: ModeSearch, tiers: list[str]) -> str:
    best = mode.best()
    if best is None:
        return f"| {mode.mode} | none VALID |" + " — |" * (5 + len(tiers))
    return (
        f"| {mode.mode} | {mode.best_qps:g} | {_ms(best.loadgen.p99_ms)} | {_ms(best.rank_ms.p99)} | "
        f"{_rates(best, tiers)} | {_pct(best.history.computed_share)} | {_waits(best.prefix_wait_ms.all)} | "
        f"{_waits(best.prefix_wait_ms.by_tier.get('hbm'))} |"
    )


def why_invalid(run: RunResult) -> str:
    """The checks an INVALID run failed: LoadGen's (P99, early stopping, min duration, min queries) and
    failed calls; empty for a VALID run."""
    lg = run.loadgen
    checks = {
        "P99": lg.performance_constraints,
        "early stopping": lg.early_stopping,
        "min duration": lg.min_duration,
        "min queries": lg.min_queries,
        "failed calls": run.failed <= run.settings.max_error_fraction * run.completed,
    }
    return ", ".join(name for name, ok in checks.items() if ok is False)


def _run_row(run: RunResult, tiers: list[str]) -> str:
    s, lg = run.settings, run.loadgen
    return (
        f"| {s.mode} | {s.target_qps:g} | {_verdict(run)} | {_ms(lg.p99_ms)} | {_ms(lg.max_ms)} | "
        f"{lg.samples_per_s} | {run.failed} | {_rates(run, tiers)} | {_pct(run.history.computed_share)} | "
        f"{_ms(run.prefix_wait_ms.all.p99)} |"
    )
