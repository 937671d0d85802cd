"""`python -m bench serving`'s settings, each a flag with a `RELAYGR_…` environment twin."""

from __future__ import annotations

import dataclasses

from services.common.config import numbers, setting

RANKER_SERVICE = "relaygr.v1.RankerService"
DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    model_preset: str = setting("cpu-tiny", "the ranker's model preset")
    device: str = setting(
        "cpu",
        "the ranker's device and the in-process passes': cpu, or cuda (each point then reads how busy the "
        "GPU was over its measured pairs)",
        choices=DEVICES,
    )
    torch_threads: int = setting(1, "torch threads of the ranker (and of the in-process passes)", above=0)
    lengths: str = numbers("256,1024,4096,8192", "long-term lengths of the overhead points (comma list)", int)
    rate: float = setting(20.0, "PreInfer + Rank pairs a second at the overhead points (open loop)", above=0)
    max_device_share: float = setting(
        0.6,
        "a length whose model passes alone would keep the device thread busier than this share at --rate is "
        "driven at the rate that keeps it at this share (the rate used is recorded)",
        above=0,
    )
    pairs: int = setting(300, "measured pairs a point", above=0)
    max_point_s: float = setting(
        40.0,
        "a point driven at a lower rate measures fewer pairs, to last at most this long (50 at least)",
        above=0,
    )
    warmup_pairs: int = setting(30, "pairs sent before each point's measurement", minimum=0)
    short_term: int = setting(16, "short-term events of each Rank", above=0)
    candidates: int = setting(512, "candidates of each Rank at the overhead points", above=0)
    candidate_counts: str = numbers(
        "128,1024",
        "more candidate counts, at the first length, for the slope per candidate (comma list)",
        int,
        may_be_empty=True,
    )
    relay_window_ms: float = setting(30.0, "from a PreInfer to its Rank (the relay window)", minimum=0)
    capacity_rates: str = numbers(
        "100,200,300",
        "pair rates of the capacity sweep, at a near-free model (comma list; empty: none)",
        may_be_empty=True,
    )
    capacity_length: int = setting(64, "long-term events at the capacity sweep", above=0)
    capacity_candidates: int = setting(16, "candidates at the capacity sweep", above=0)
    capacity_seconds: float = setting(10.0, "measured seconds a capacity point", above=0)
    idle_pairs: int = setting(
        100, "sequential pairs on an idle ranker for the cached Rank's latency", minimum=0
    )
    stages: bool = setting(False, "sample the ranker with py-spy (250 Hz) and split its CPU by stage")
    out: str = setting("bench/results/serving", "folder of results.json and summary.md (empty: none)")
    seed: int = setting(0, "seed of the users' histories and candidates", minimum=0)
