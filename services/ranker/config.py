"""Ranker settings: each is a flag with a `RELAYGR_…` environment twin (see services.common.config)."""

from __future__ import annotations

import dataclasses
import socket

from services.affinity.settings import AffinitySettings
from services.common import validation
from services.common.config import ServiceConfig, setting
from services.common.errors import InvalidArgument
from services.common.settings import RequestLimits
from services.ranker.cache.tiers import POLICIES
from services.ranker.handoff.settings import HandoffSettings
from services.ranker.model.family import ModelConfig
from services.ranker.model.kv_precision import DRAM_PRECISIONS
from services.ranker.model.presets import PRESETS, get_preset
from services.ranker.model.store import is_model_dir, read_config


@dataclasses.dataclass(frozen=True)
class RankerConfig(HandoffSettings, AffinitySettings, RequestLimits, ServiceConfig):
    port: int = setting(50051, "gRPC port (0 picks a free port)")
    metrics_port: int = setting(9101, "Prometheus metrics port (0 picks a free port; -1 disables)")
    instance_name: str = setting(
        "", "stable member name the router hashes on (the StatefulSet pod name); empty: the host name"
    )
    model_preset: str = setting("cpu-small", f"model preset: {', '.join(PRESETS)}", choices=PRESETS)
    checkpoint: str = setting(
        "",
        "a model directory (model.json + weights.pt, its architecture replacing --model-preset) or a "
        "state_dict file of the preset's model (empty: seeded weights)",
    )
    device: str = setting("auto", "npu, cuda, cpu, or auto (first available in that order); e.g. cuda:1")
    device_sharers: int = setting(
        1,
        "ranker processes that share this ranker's device (K), each a ring member with 1/K of the auto HBM "
        "and DRAM budgets (explicit budgets are its own)",
        above=0,
    )
    hbm_budget_mb: float = setting(
        -1.0,
        "byte budget of the HBM tier (prefix KV in device memory), MiB (0: no caching; -1: auto, from the "
        "preset and the device's memory)",
    )
    dram_budget_mb: float = setting(
        -1.0,
        "byte budget of the server-local DRAM tier, MiB (0 disables it; -1: auto, from the preset and the "
        "host's memory)",
    )
    dram_ttl_s: float = setting(60.0, "seconds a DRAM entry may live without being used", minimum=0)
    dram_policy: str = setting(
        "lru", "DRAM eviction policy: lru, or size (largest-first among the stale)", choices=POLICIES
    )
    dram_precision: str = setting(
        "exact",
        "what DRAM copies are stored in: exact (the model's dtype), or bf16 or fp8 (a half or a quarter of "
        "fp32's bytes, lossy for the Ranks served from them)",
        choices=DRAM_PRECISIONS,
    )
    lease_ttl_ms: int = setting(
        3000, "how long a pre-inferred HBM entry is leased awaiting its Rank", above=0
    )
    drain_min_s: float = setting(
        2.0,
        "after SIGTERM, seconds the ranker keeps serving while reporting NOT_SERVING, so that routers "
        "(health checked every --health-interval-s) stop sending before it stops accepting",
        minimum=0,
    )
    pre_infer_chunk_tokens: int = setting(
        512,
        "pre-inference runs in chunks of this many tokens; a Rank waits at most one",
        above=0,
    )
    candidate_microbatch: int = setting(
        0,
        "score candidates in microbatches of this size (0: all at once; set, it disables --rank-batch-max)",
        minimum=0,
    )
    rank_batch_max: int = setting(
        8,
        "cached Ranks queued together run as one device pass of up to this many users (1: one at a time); "
        "batching takes only what is already queued, it never waits",
        above=0,
    )
    cuda_graphs: bool = setting(
        False,
        "replay cached ranks through CUDA graphs captured per shape bucket on first use (CUDA only; not with "
        "--candidate-microbatch)",
    )
    cuda_graph_length_buckets: str = setting(
        "512,1024,2048,3072,4096,6144,8192,12288,16384",
        "prefix lengths that CUDA graphs are captured for (a prefix is padded, exactly, to the next one; "
        "longer ones run eagerly)",
    )
    cuda_graph_max: int = setting(
        64, "CUDA graphs kept at most (the least recently used is dropped beyond)", above=0
    )
    pre_infer_inflight_chunks: int = setting(
        2,
        "pre-infer chunks the device thread may have queued on an accelerator before it waits for the "
        "oldest: with the rank stream's priority, this bounds a Rank's wait behind pre-inference",
        above=0,
    )
    max_pending_pre_infer: int = setting(
        64,
        "pre-infer productions queued beyond this are shed (REJECTED_OVERLOAD)",
        above=0,
    )
    max_pre_infer_batch: int = setting(
        64,
        "most entries one PreInferBatch call may carry; a larger (or an empty) batch is refused whole with "
        "INVALID_ARGUMENT naming requests",
        above=0,
    )
    max_pre_infer_backlog_ms: float = setting(
        1000.0,
        "device ms of pre-inference already queued on this ranker at which a PreInfer is refused "
        "(REJECTED_BACKLOG)",
        above=0,
    )
    max_tombstones: int = setting(
        100_000,
        "users whose last miss reason is remembered (evicted, expired, refused) to explain their next miss",
        above=0,
    )
    sweep_interval_ms: int = setting(
        50,
        "least ms between two sweeps that release expired leases and DRAM entries idle past their TTL (the "
        "sweeper wakes when the soonest of them is due, not on a tick)",
        above=0,
    )
    max_queued_ranks: int = setting(
        256, "Ranks waiting for the device beyond this get RESOURCE_EXHAUSTED", above=0
    )
    torch_threads: int = setting(
        0,
        "intra-op CPU threads for torch (0: as many as the process may use: the fewer of its CPU affinity "
        "and its cgroup CPU quota, never torch's one per host core)",
        minimum=0,
    )
    profile_lengths: str = setting(
        "128,512,2048,8192",
        "prefix lengths of the warm-up latency curve (16 events are always measured too: a pass that short "
        "is almost all a model call's fixed cost, which the trigger's break-even reads)",
    )
    profile_short_term: int = setting(16, "short-term length used by the warm-up latency curve", above=0)
    profile_candidates: int = setting(128, "candidate count used by the warm-up latency curve", above=0)
    profile_repeats: int = setting(
        3,
        "timed rounds across every length of the latency curve (the least kept per point; as many more while "
        "a shorter point measures dearer than a longer one)",
        above=0,
    )
    profile_disturbed_ratio: float = setting(
        1.5,
        "on a CPU device, a warm-up length whose passes took more than this times the device thread's own "
        "CPU time ran disturbed (other work held its cores) and is measured again",
        above=1,
    )
    profile_retry_rounds: int = setting(
        0,
        "rounds the warm-up may add for the lengths measured disturbed (0: a disturbed curve is served "
        "provisional at once, and measured again in idle device time)",
        minimum=0,
    )
    profile_recheck_s: float = setting(
        2.0,
        "a provisional curve is measured again, one length at a time, each once the device thread has run "
        "nothing for this many seconds",
        above=0,
    )

    def resolved(self) -> RankerConfig:
        """With `--instance-name` defaulted to the host name (a StatefulSet pod's name)."""
        return dataclasses.replace(self, instance_name=self.instance_name or socket.gethostname())

    def validate(self) -> None:
        super().validate()
        self.validate_affinity()
        budgets = (("--hbm-budget-mb", self.hbm_budget_mb), ("--dram-budget-mb", self.dram_budget_mb))
        for flag, value in budgets:
            if value != -1 and not value >= 0:  # `not >=`: NaN is refused too
                raise ValueError(f"{flag} must be -1 (auto) or not negative, got {value}")
        preset = self.model_config()
        if self.max_long_term_events + self.max_short_term_events > preset.max_events:
            raise ValueError(
                f"--max-long-term-events ({self.max_long_term_events}) + --max-short-term-events "
                f"({self.max_short_term_events}) exceed the {preset.max_events} events preset "
                f"{preset.name!r} has positions for ({preset.max_positions}, one of them the candidates')"
            )
        if self.cuda_graphs and self.candidate_microbatch:
            raise ValueError("--cuda-graphs ranks all candidates at once: it excludes --candidate-microbatch")
        self.cuda_graph_bucket_list()
        if self.instance_name:
            try:
                validation.instance_name(self.instance_name, "--instance-name")
            except InvalidArgument as exc:
                raise ValueError(str(exc)) from None
        self.profile_length_list()

    def model_config(self) -> ModelConfig:
        """The served model's config: a model directory's model.json, else the preset."""
        if self.checkpoint and is_model_dir(self.checkpoint):
            return read_config(self.checkpoint)
        return get_preset(self.model_preset)

    def profile_length_list(self) -> list[int]:
        try:
            lengths = sorted({int(x) for x in self.profile_lengths.split(",") if x.strip()})
        except ValueError as exc:
            raise ValueError(f"--profile-lengths: {exc}") from exc
        if not lengths or lengths[0] <= 0:
            raise ValueError("--profile-lengths must list positive lengths")
        return [n for n in lengths if n <= self.max_long_term_events] or [self.max_long_term_events]

    def cuda_graph_bucket_list(self) -> list[int]:
        try:
            buckets = sorted({int(x) for x in self.cuda_graph_length_buckets.split(",") if x.strip()})
        except ValueError as exc:
            raise ValueError(f"--cuda-graph-length-buckets: {exc}") from None
        if not buckets or buckets[0] <= 0:
            raise ValueError("--cuda-graph-length-buckets must list positive lengths")
        return buckets
