"""The ranker's metrics: Ranks by cache source and miss reason, PreInfer outcomes, model time, shedding,
the KV cache's tiers, leases and productions. Label names follow `services/common/metrics.py`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

RANK_REQUESTS = Counter(
    "relaygr_rank_requests_total", "Ranks served, by prefix cache source.", ["cache_source"]
)
RANK_MISSES = Counter(
    "relaygr_rank_misses_total", "Ranks that computed their whole prefix, by reason.", ["reason"]
)
RANK_LATENCY = Histogram(
    "relaygr_rank_latency_seconds",
    "Ranker-side Rank latency (queueing and model), by prefix cache source.",
    ["cache_source"],
    buckets=LATENCY_BUCKETS,
)
RANK_LOSSY = Counter(
    "relaygr_rank_lossy_total",
    "Ranks whose prefix came from a lossy (bf16 or FP8) DRAM copy, by cache source: their scores equal a "
    "full recomputation only within the copy's epsilon.",
    ["cache_source"],
)
PRE_INFER_OUTCOMES = Counter(
    "relaygr_pre_infer_total",
    "PreInfer signals by outcome, each entry of a PreInferBatch counted as one (entries refused as bad input "
    "are not).",
    ["outcome"],
)
PRE_INFER_BATCH_SIZE = Histogram(
    "relaygr_pre_infer_batch_size",
    "Entries per PreInferBatch call that the ranker scheduled together (entries refused as bad input aside).",
    buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128),
)
MODEL_SECONDS = Histogram(
    "relaygr_model_seconds",
    "Time on the ranker's device and copy threads per job, by op: pre_infer, extend, rank, uncached "
    "(model passes), reload, demote (tier copies, where a move copies: on an accelerator, or to lossy "
    "DRAM), profile (warm-up). Jobs run as one batch each count an equal share of its time.",
    ["op"],
    buckets=LATENCY_BUCKETS,
)
MODEL_CPU_SECONDS = Counter(
    "relaygr_model_cpu_seconds",
    "CPU time of the ranker's device and copy threads inside their jobs (thread CPU time, which on an "
    "accelerator is the host's launch cost), by op as relaygr_model_seconds, each job's own (the Ranks a "
    "pre-inference lets run between its chunks count theirs): what the host spends on the model itself, "
    "apart from serving.",
    ["op"],
)
DEVICE_BATCH_SIZE = Histogram(
    "relaygr_device_batch_size",
    "Jobs run together in one device pass (cached ranks of several users), by op.",
    ["op"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
)
COST_CORRECTION = Gauge(
    "relaygr_cost_correction",
    "Measured device time over what the warm-up latency curve predicted for the same work, by path "
    "(full_ms, pre_infer_ms, rank_ms), over about the last 100 jobs (1 until 10 jobs of the path have run): "
    "the factor the ranker's load reports, shedding and GetProfile apply to the curve's points that no job "
    "has reached yet; each point that jobs reached is scaled by its own such ratio.",
    ["path"],
)
TORCH_THREADS = Gauge(
    "relaygr_torch_threads",
    "Intra-op CPU threads torch runs the model with, and what chose them (source: the --torch-threads "
    "flag, the affinity mask, or the cgroup CPU quota).",
    ["source"],
)
CURVE_PROVISIONAL = Gauge(
    "relaygr_latency_curve_provisional",
    "1 while the latency curve is provisional (its warm-up ran disturbed: wall time far above the device "
    "thread's CPU time) and not yet measured again undisturbed; GetProfile says so too.",
)
DEVICE_QUEUE_DEPTH = Gauge(
    "relaygr_device_queue_depth", "Model jobs waiting for the device thread, by priority.", ["priority"]
)
SHED_REQUESTS = Counter(
    "relaygr_shed_requests_total",
    "Requests refused before any work, by method and reason.",
    ["method", "reason"],
)
KV_CACHE_BYTES = Gauge("relaygr_kv_cache_bytes", "Bytes of prefix KV held, per tier.", ["tier"])
KV_CACHE_CAPACITY_BYTES = Gauge(
    "relaygr_kv_cache_capacity_bytes", "Byte budget of each cache tier.", ["tier"]
)
KV_CACHE_ENTRIES = Gauge("relaygr_kv_cache_entries", "Prefix KV entries held, per tier.", ["tier"])
KV_CACHE_EVICTIONS = Counter(
    "relaygr_kv_cache_evictions_total", "Entries removed from a tier, by reason.", ["tier", "reason"]
)
LEASES_ACTIVE = Gauge("relaygr_leases_active", "HBM entries leased and not yet consumed.")
LEASE_EXPIRATIONS = Counter(
    "relaygr_lease_expirations_total", "Leases released by their deadline rather than by a consuming Rank."
)
PRODUCTIONS = Counter(
    "relaygr_productions_total",
    "Prefix productions started (compute, reload, extend); joiners do not count.",
    ["kind"],
)
PRODUCTION_JOINS = Counter(
    "relaygr_production_joins_total", "Requests that joined an in-flight production instead of starting one."
)
PRE_INFER_TOKENS = Counter(
    "relaygr_pre_infer_tokens_total",
    "Tokens computed by pre-inference, by fate once the prefix's lease ended: consumed by a Rank, or wasted "
    "(the lease expired or the entry was dropped unconsumed).",
    ["fate"],
)
PRE_INFER_WASTED_SECONDS = Counter(
    "relaygr_pre_infer_wasted_seconds_total",
    "Device seconds (estimated from the latency curve) of pre-inference no Rank consumed.",
)
PRE_INFER_BACKLOG_SECONDS = Gauge(
    "relaygr_pre_infer_backlog_seconds",
    "Device seconds of pre-inference started and not finished (estimated from the latency curve).",
)
RANK_BACKLOG_SECONDS = Gauge(
    "relaygr_rank_backlog_seconds",
    "Device seconds of the Ranks in flight, their misses' prefix computations included: the queue wait a "
    "new Rank sees (the per-ranker queue metric to scale on).",
)
HANDOFF_SENT_ENTRIES = Counter(
    "relaygr_handoff_sent_entries",
    "Entries a draining ranker handed off, by outcome: sent (streamed whole to the user's next owner), "
    "skipped_ttl (its DRAM TTL would run out before it arrived), skipped_time (the handoff's time budget "
    "ran out first), failed (its stream broke), no_owner (no other ranker was routable).",
    ["outcome"],
)
HANDOFF_SENT_BYTES = Counter("relaygr_handoff_sent_bytes", "KV bytes of the entries handed off whole.")
HANDOFF_RECEIVED_ENTRIES = Counter(
    "relaygr_handoff_received_entries",
    "Entries received from other rankers (pushed by a drain, or fetched by a read-through), by outcome: "
    "admitted (into DRAM), held (already here: acknowledged), model_version, layout, checksum, budget, "
    "invalid (refused for that), torn (the stream ended before the entry's last chunk).",
    ["outcome"],
)
HANDOFF_RECEIVED_BYTES = Counter(
    "relaygr_handoff_received_bytes", "KV bytes received from other rankers, whatever became of them."
)
HANDOFF_DURATION = Gauge(
    "relaygr_handoff_duration_seconds", "How long the last drain's handoff took (its budget: the next)."
)
HANDOFF_BUDGET = Gauge("relaygr_handoff_budget_seconds", "The time budget of a drain's handoff.")
READ_THROUGH = Counter(
    "relaygr_read_through",
    "Misses that asked a peer for the prefix after a ring change, by outcome: hit (a peer's entry admitted), "
    "miss (no peer had it), timeout, error, skipped (a Rank's transfer was predicted slower than computing).",
    ["outcome"],
)
READ_THROUGH_BYTES = Counter("relaygr_read_through_bytes", "KV bytes fetched from peers and admitted.")
