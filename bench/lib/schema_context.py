"""The part of results.json that says where a run ran: the in-process floor and the idle fleet's cached Rank
(measured before any load), the machine, the versions, the checks a committed run recorded, the host's
unit and the Ranks over the SLO. `bench.lib.schema` holds the rest and re-exports these."""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.lib.codec import optional, schema


@dataclasses.dataclass(frozen=True, kw_only=True)
class FloorPoint:
    """The in-process floor at one prefix length: median ms of a full forward, a pre-inference and a rank
    against the cached prefix (the ranker's `LatencyPoint`)."""

    prefix_length: int
    full_ms: float
    pre_infer_ms: float
    rank_ms: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class CachedRankPoint:
    """Ranks through the router against a prefix a PreInfer leased in HBM, on an idle fleet."""

    prefix_length: int
    request_kib: float
    serialize_ms: float  # client-side serialization of the Rank request (median)
    rank_ms_p50: float | None  # client-observed Rank latency of the HBM-served Ranks (None: none was)
    rank_ms_p99: float | None
    sources: dict[str, int]


@schema
class Machine:
    cores: int | None
    cpu_model: str
    memory_gib: float | None
    platform: str
    python: str
    load_average_at_start: list[float] | None = optional()
    gpu: dict[str, Any] | None = optional()  # `bench.lib.gpu_monitor.gpu_info`: absent without a GPU
    load_average_at_end: list[float] | None = optional()  # absent from a checkpoint before the end
    # The widest vector instructions torch's CPU kernels use (AVX2, AVX512, ...): one CPU model name may be
    # hosts with and without AVX-512, at two floors.
    cpu_capability: str | None = optional()


@schema
class Versions:
    """Package versions (absent: not recorded by an older run) and the commit."""

    torch: str
    numpy: str | None = optional()
    grpcio: str | None = optional()
    protobuf: str | None = optional()
    matplotlib: str | None = optional()
    torch_cuda: str | None = optional()  # "none": a torch without CUDA
    git_commit: str  # with `-dirty` when tracked files had changes


@schema
class RunChecks:
    """The checks a committed run recorded (no run takes them now): how far the in-process floor moved
    from the previous committed run of the profile on the same host, how many cores other users took
    during the points, and the flags these raised (empty: none)."""

    floor_reference: str  # the committed run compared with
    floor_drift: float  # relative change of the floor's summed full forwards at the shared lengths
    foreign_cores_mean: float  # over every measured point, by its wall time
    foreign_cores_max: float
    flags: list[str]


@dataclasses.dataclass(kw_only=True)
class HostUnit:
    """The host's own unit of time u and the run's bounds in it: u is the in-process full pass of the
    fleet's preset at the first mix's cap, timed in a fresh process at the run's start; the SLO and the
    relay window are multiples of it (None: the bound was set absolute, in ms)."""

    u_ms: float
    length: int
    model_preset: str
    slo_u: float | None
    relay_window_u: float | None
    slo_ms: float
    relay_window_ms: float
    slo_multiples: list[float]

    def describe(self) -> str:
        """The run's bounds in the host's unit and in ms (`SLO 2.87 u = 185 ms`)."""

        def bound(name: str, multiple: float | None, ms: float) -> str:
            return (
                f"{name} {ms:g} ms (absolute)" if multiple is None else f"{name} {multiple:g} u = {ms:g} ms"
            )

        window = bound("relay window", self.relay_window_u, self.relay_window_ms)
        return f"{bound('SLO', self.slo_u, self.slo_ms)}, {window}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OverSlo:
    """The measured Ranks over the SLO (failures included) of one point (`bench.lib.points.over_slo`), so a
    failing load says why: where their prefixes came from, why they missed, what the trigger answered,
    how long they waited for an in-flight prefix, how much prefix they computed on the critical path,
    and whether they came together. A burst is a run of them each sent within `burst_gap_s` of the one
    before: a stall or a queue that built up and drained puts many in one; load alone spreads them out.
    Its counts are sums, so that a load's seeds pool by adding them."""

    requests: int
    failed: int
    cache_sources: dict[str, int]
    miss_reasons: dict[str, int]
    admit_reasons: dict[str, int]
    prefix_wait_ms: float  # summed over the answered ones: how long they waited for in-flight prefixes
    long_term_events: int  # summed over the answered ones
    computed_prefix_events: int  # of those, the ones computed on the critical path
    bursts: int
    largest_burst: int
    burst_gap_s: float
