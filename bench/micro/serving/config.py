"""`python -m bench serving`'s settings, each a flag with a `RELAYGR_…` environment twin: the sweep's, and
those of driving rankers in turn (`--in-turn-against`, `in_turn`)."""

from __future__ import annotations

import dataclasses

from bench.micro.pairs import PairSettings
from services.common.config import listed, numbers, setting

DEVICES = ("cpu", "cuda")
# What --in-turn-against may name: the serving floor and the free-pass ranker, or --before-tree's ranker.
IN_TURN = ("stand-ins", "before")
SHAPES = "256:20,1024:12"  # --shapes' default: long-term events:pairs a second


@dataclasses.dataclass(frozen=True)
class ServingConfig(PairSettings):
    model_preset: str = setting("cpu-tiny", "the ranker's model preset")
    device: str = setting(
        "cpu",
        "the ranker's device and the in-process passes': cpu, or cuda (each point then reads how busy the "
        "GPU was over its measured pairs)",
        choices=DEVICES,
    )
    torch_threads: int = setting(1, "torch threads of the ranker (and of the in-process passes)", above=0)
    lengths: str = numbers("256,1024,4096", "long-term lengths of the points (comma list)", int)
    candidates: int = setting(512, "candidates of each Rank", above=0)
    rate: float = setting(20.0, "pairs a second at the low-rate points (open loop)", above=0)
    max_low_share: float = setting(
        0.6,
        "a process whose capacity is below --rate / this share is driven at this share of its capacity at "
        "its low-rate point (the rate used is recorded)",
        above=0,
        maximum=1,
    )
    pairs: int = setting(
        300, "measured pairs of a low-rate point (and of each point driven in turn)", above=0
    )
    max_point_s: float = setting(
        40.0, "a point at a rate too low for its pairs measures fewer, to last about this long", above=0
    )
    point_seconds: float = setting(8.0, "measured seconds of a half-capacity or capacity point", above=0)
    warmup_pairs: int = setting(30, "pairs sent at the point's rate before its measured ones", minimum=0)
    capacity_p99_ms: float = setting(
        25.0,
        "Rank P99, ms, within which a process holds a rate (plus twice a pair's model passes with real "
        "ones): its capacity is the highest rate it holds",
        above=0,
    )
    capacity_start: float = setting(
        50.0,
        "pairs a second of the capacity search's first step (with real passes at most a quarter of the rate "
        "the passes alone would fill the device thread at)",
        above=0,
    )
    capacity_growth: float = setting(1.5, "each step of the capacity search multiplies the rate by", above=1)
    capacity_refine: int = setting(
        2, "halvings of the interval between the last rate held and the first not", minimum=0
    )
    capacity_seconds: float = setting(4.0, "measured seconds of a capacity search step", above=0)
    generator_cpus: str = setting(
        "",
        "CPUs of the load generator's process (comma list; empty: the last CPU this process may use); the "
        "ranker and the floor run on the rest, so each figure is the measured process's own",
    )
    windows_ms: str = numbers(
        "2,5,10",
        "PreInferBatch windows, ms, measured against single PreInfers at each ranker's capacity at the first "
        "length (comma list; empty: no coalescing points)",
        increasing=True,
        may_be_empty=True,
    )
    idle_pairs: int = setting(
        100, "sequential pairs on an idle ranker for the cached Rank's latency", minimum=0
    )
    stages: bool = setting(False, "sample the ranker with py-spy (250 Hz) and split its CPU by stage")
    out: str = setting(
        "bench/results/serving", "folder of the sweep's results.json and summary.md (empty: none)"
    )
    in_turn_against: str = setting(
        "",
        "contenders driven in turn with this ranker at --shapes instead of the sweep, comma-separated: "
        "stand-ins (the serving floor and a free-pass ranker) or before (--before-tree's; empty: the sweep)",
        items=str,
        choices=IN_TURN,
        distinct=True,
        may_be_empty=True,
    )
    before_tree: str = setting(
        "", "another checkout, with its generated stubs, whose ranker --in-turn-against before drives"
    )
    shapes: str = setting(
        SHAPES,
        "in turn: the points, long-term events:pairs a second, comma-separated (e.g. 256:20); events at most "
        "the longest of --lengths (the rankers' --max-long-term-events)",
    )
    rounds: int = setting(
        3, "in turn: rounds; each drives every contender once, in an order that rotates", above=0
    )

    def validate(self) -> None:
        from bench.micro.serving.generator import split_cpus

        split_cpus(self.generator_cpus)  # CPUs this process may not use, or none left for the ranker
        longest = max(listed(self, "lengths"))
        shapes = self.shape_list()  # checked in every mode; its lengths matter only to rankers in turn
        if listed(self, "in_turn_against") and any(length > longest for length, _ in shapes):
            raise ValueError(f"--shapes: {self.shapes!r} is longer than the longest --lengths, {longest}")
        if bool(self.before_tree) != ("before" in listed(self, "in_turn_against")):
            raise ValueError("--before-tree and --in-turn-against before go together")

    def shape_list(self) -> list[tuple[int, float]]:
        """`--shapes` as (long-term events, pairs a second); a ValueError naming the flag for a bad one."""
        shapes = []
        for shape in self.shapes.split(","):
            length, _, rate = shape.partition(":")
            try:
                parsed = int(length), float(rate)
            except ValueError:
                parsed = (0, 0.0)
            if parsed[0] <= 0 or not parsed[1] > 0:
                raise ValueError(f"--shapes: {shape!r} is not events:pairs-a-second (e.g. 256:20)")
            shapes.append(parsed)
        return shapes
