"""The prefix KV cache: tier bytes against their budgets, churn, miss reasons, leases and productions."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard

from tools.dashboards.panels import (
    Row,
    Target,
    build_dashboard,
    quantile,
    ratio,
    selector,
    summed_rate,
    timeseries_panel,
)

UID = "relaygr-cache"

RANKER = selector("ranker")
CAPACITY = f"sum by (pod, tier) (relaygr_kv_cache_capacity_bytes{RANKER})"
UTILISATION = ratio(
    f"sum by (pod, tier) (relaygr_kv_cache_bytes{RANKER})",
    f"sum by (pod, tier) (relaygr_kv_cache_capacity_bytes{RANKER} > 0)",
)


def build() -> dashboard.Dashboard:
    tiers = Row(
        "Tiers",
        [
            timeseries_panel(
                "KV bytes against capacity",
                "Prefix KV bytes held in each tier of each ranker (solid) and that tier's byte budget "
                "(dashed). Budgets are never exceeded: an entry that does not fit is refused.",
                "bytes",
                [
                    Target(f"sum by (pod, tier) (relaygr_kv_cache_bytes{RANKER})", "{{pod}} {{tier}}"),
                    Target(CAPACITY, "{{pod}} {{tier}} capacity"),
                ],
                dashed="capacity$",
            ),
            timeseries_panel(
                "Tier utilisation",
                "Bytes held over the byte budget, per ranker and tier. A full HBM tier refuses PreInfers; "
                "the DRAM tier is an LRU cache whose steady state is full.",
                "percentunit",
                [Target(UTILISATION, "{{pod}} {{tier}}")],
            ),
            timeseries_panel(
                "Entries per tier",
                "Prefix KV entries held in each tier of each ranker.",
                "short",
                [Target(f"sum by (pod, tier) (relaygr_kv_cache_entries{RANKER})", "{{pod}} {{tier}}")],
            ),
            timeseries_panel(
                "Pre-infer outcomes",
                "PreInfer signals per second by outcome: accepted, already cached, reloaded from DRAM, "
                "refused for capacity or shed for overload.",
                "reqps",
                [Target(summed_rate("relaygr_pre_infer_total", RANKER, by="outcome"), "{{outcome}}")],
                stacked=True,
            ),
        ],
    )
    churn = Row(
        "Evictions and misses",
        [
            timeseries_panel(
                "Evictions by tier and reason",
                "Entries removed from a tier per second, and why.",
                "ops",
                [
                    Target(
                        summed_rate("relaygr_kv_cache_evictions_total", RANKER, by="tier, reason"),
                        "{{tier}} {{reason}}",
                    )
                ],
                stacked=True,
            ),
            timeseries_panel(
                "Misses by reason",
                "Ranks that computed their whole prefix, per second, by reason: never pre-inferred, still "
                "cold, evicted, lease expired, stale, refused for capacity or routed elsewhere.",
                "ops",
                [Target(summed_rate("relaygr_rank_misses_total", RANKER, by="reason"), "{{reason}}")],
                stacked=True,
            ),
        ],
    )
    production = Row(
        "Leases and productions",
        [
            timeseries_panel(
                "Active leases",
                "HBM entries leased and awaiting their Rank, per ranker.",
                "short",
                [Target(f"sum by (pod) (relaygr_leases_active{RANKER})", "{{pod}}")],
                width=8,
            ),
            timeseries_panel(
                "Lease expirations",
                "Leases released by their deadline rather than by a consuming Rank, per second.",
                "ops",
                [Target(summed_rate("relaygr_lease_expirations_total", RANKER, by="pod"), "{{pod}}")],
                width=8,
            ),
            timeseries_panel(
                "Productions and joins",
                "Prefix productions started per second by kind (compute, reload, extend), and requests "
                "that joined a production already in flight instead of starting one.",
                "ops",
                [
                    Target(summed_rate("relaygr_productions_total", RANKER, by="kind"), "{{kind}}"),
                    Target(summed_rate("relaygr_production_joins_total", RANKER), "joins"),
                ],
                width=8,
            ),
            timeseries_panel(
                "Device queue depth",
                "Model jobs waiting for each ranker's device thread, by priority.",
                "short",
                [
                    Target(
                        f"sum by (pod, priority) (relaygr_device_queue_depth{RANKER})", "{{pod}} {{priority}}"
                    )
                ],
            ),
            timeseries_panel(
                "Backlog and wasted pre-inference",
                "Device seconds of Ranks in flight (the wait a new Rank sees) and of pre-inference not yet "
                "finished, per ranker; and the device seconds per second spent on pre-inference no Rank "
                "consumed (what the trigger's waste brake budgets).",
                "s",
                [
                    Target(f"sum by (pod) (relaygr_rank_backlog_seconds{RANKER})", "{{pod}} rank backlog"),
                    Target(
                        f"sum by (pod) (relaygr_pre_infer_backlog_seconds{RANKER})",
                        "{{pod}} pre-infer backlog",
                    ),
                    Target(summed_rate("relaygr_pre_infer_wasted_seconds_total", RANKER), "wasted per s"),
                ],
            ),
            timeseries_panel(
                "Model time P99 by operation",
                "P99 of the device time per model operation.",
                "s",
                [Target(quantile(0.99, "relaygr_model_seconds", RANKER, by="op"), "{{op}}")],
            ),
            timeseries_panel(
                "Latency-curve correction",
                "Measured device time over what each ranker's warm-up latency curve predicted for the same "
                "work, per path: 1 is a curve that holds; far from 1, the warm-up misread the device "
                "(rankers warming up together) or the host's speed moved. Backlogs, shedding and "
                "GetProfile apply it.",
                "short",
                [Target(f"max by (pod, path) (relaygr_cost_correction{RANKER})", "{{pod}} {{path}}")],
            ),
        ],
    )
    return build_dashboard(
        UID,
        "RelayGR / Prefix cache",
        "The rankers' prefix KV cache: HBM and DRAM tiers against their budgets, evictions, miss reasons, "
        "leases and productions, and its handoff between rankers through rollouts and scaling.",
        "ranker",
        [tiers, churn, production, handoff()],
    )


HIT_SHARE = ratio(
    summed_rate("relaygr_rank_requests_total", RANKER, by="cache_source"),
    summed_rate("relaygr_rank_requests_total", RANKER),
    matching="ignoring (cache_source) group_left",
)


def handoff() -> Row:
    """Caches through rollouts: where Ranks found their prefix, and what drains and read-throughs moved."""
    return Row(
        "Handoff through rollouts",
        [
            timeseries_panel(
                "Hit rate by tier",
                "Share of Ranks by where their prefix came from: HBM, DRAM, a peer, extended, or a miss. A "
                "peer hit is the first use of a prefix another ranker handed off or was fetched from: "
                "through a rolling restart or a scale step, it replaces the misses a drained ranker's users "
                "would have on their next owner, and a returning ranker's on its users; their later Ranks "
                "are HBM or DRAM hits.",
                "percentunit",
                [Target(HIT_SHARE, "{{cache_source}}")],
                width=24,
                stacked=True,
            ),
            timeseries_panel(
                "Handoff entries",
                "Entries per second a draining ranker sent (or skipped: TTL, time budget; failed; no owner), "
                "and entries its peers received, by outcome (admitted, held, refused by reason, torn). A "
                "drained ranker's own series end when it exits: the receivers' are the lasting record.",
                "ops",
                [
                    Target(
                        summed_rate("relaygr_handoff_sent_entries_total", RANKER, by="outcome"),
                        "sent {{outcome}}",
                    ),
                    Target(
                        summed_rate("relaygr_handoff_received_entries_total", RANKER, by="outcome"),
                        "received {{outcome}}",
                    ),
                ],
                width=8,
            ),
            timeseries_panel(
                "Read-through",
                "Misses that asked a peer for the prefix after a ring change, per second by outcome (hit, "
                "miss, timeout, error, skipped: predicted slower than computing), and the KV bytes fetched.",
                "ops",
                [
                    Target(summed_rate("relaygr_read_through_total", RANKER, by="outcome"), "{{outcome}}"),
                    Target(summed_rate("relaygr_read_through_bytes_total", RANKER), "bytes/s fetched"),
                ],
                width=8,
            ),
            timeseries_panel(
                "Handoff bytes and duration",
                "KV bytes per second handed off whole and received; the last drain's handoff duration of "
                "each ranker against its budget (dashed).",
                "short",
                [
                    Target(summed_rate("relaygr_handoff_sent_bytes_total", RANKER), "bytes/s sent"),
                    Target(summed_rate("relaygr_handoff_received_bytes_total", RANKER), "bytes/s received"),
                    Target(f"max by (pod) (relaygr_handoff_duration_seconds{RANKER})", "{{pod}} duration s"),
                    Target(f"max (relaygr_handoff_budget_seconds{RANKER})", "budget s"),
                ],
                width=8,
                dashed="budget",
            ),
        ],
    )
