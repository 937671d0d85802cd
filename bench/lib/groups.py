"""Settings groups that several bench commands take, each declared once here (as `bench.lib.fleets` declares
`FleetSettings`): a command's settings class derives from the groups it takes, and `redefault` gives one of
their settings the command's own default, its help and bounds kept.

- `SeedSettings`: runs repeated over load seeds, every mode with a seed's arrivals and users, and the
  intervals over them (`python -m bench ab`, `python -m bench rollout`).
- `RankerProfileSettings`: each ranker's warm-up curve (`python -m bench run`, `python -m bench ab`).
- `TrialSettings`: the measured Recommends of each run and the load before them (`python -m bench ab`,
  `python -m bench headline`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common.config import grid, setting


def redefault(group: type, name: str, default: Any) -> Any:
    """The setting `name` of `group` with `default` in place of the group's."""
    field = next(field for field in dataclasses.fields(group) if field.name == name)
    return dataclasses.field(default=default, metadata=field.metadata)


@dataclasses.dataclass(frozen=True)
class SeedSettings:
    """Load seeds, each run by every mode with the same arrivals and users, and the intervals over them."""

    seeds: int = setting(
        5, "load seeds, each run by every mode and each a cluster of every interval", above=0
    )
    load_seed: int = setting(0, "the first load seed: seeds are load_seed … load_seed + seeds - 1")
    confidence: float = setting(0.95, "confidence of every interval", above=0, below=1)
    block_s: float = setting(
        1.0,
        "the P99 bootstrap resamples blocks of this many seconds of requests (0: single requests)",
        minimum=0,
    )

    def seed_list(self) -> list[int]:
        return list(range(self.load_seed, self.load_seed + self.seeds))

    def block(self, rate: float) -> int:
        """Requests per bootstrap block at `rate` requests a second."""
        return max(1, round(rate * self.block_s))


@dataclasses.dataclass(frozen=True)
class RankerProfileSettings:
    """Each ranker's warm-up curve: the prefix lengths it times, and how often."""

    ranker_profile_lengths: str = grid(
        "128,256,512,2048,4096",
        "prefix lengths of each ranker's warm-up curve (the short ones place the trigger's break-even)",
        int,
    )
    ranker_profile_repeats: int = setting(
        2, "timed rounds across the lengths of each ranker's warm-up curve", above=0
    )


@dataclasses.dataclass(frozen=True)
class TrialSettings:
    """What each run (a mode or arm at one load and seed) measures, after load of its own."""

    requests: int = setting(
        1000, "measured Recommends of each run after its warm-up, none stopped early", above=0
    )
    warmup_s: float = setting(5.0, "seconds of each run's own load before its measured requests", minimum=0)
