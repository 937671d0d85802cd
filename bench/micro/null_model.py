"""`python -m bench.micro.null_model`: a ranker whose model passes are free, for `bench.micro.serving`'s
capacity sweep.

Everything but the model is the ranker's own, built by `RankerApp` from the same flags: the server, the
servicer, validation, the prefix cache with its tiers, leases and byte budgets, the scheduler, the device
and copy threads, the metrics. Only the runner's passes are replaced: a prefix is a KV buffer of its true
size (so the budgets and the tier copies see real bytes), filled with nothing, and a rank's scores are
zeros, one per candidate. What one ranker then sustains is the serving path's own capacity, the ceiling
a faster accelerator meets once its model takes no time. Its scores mean nothing: never serve it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from services.common.server import service_main
from services.ranker.app import RankerApp
from services.ranker.config import RankerConfig
from services.ranker.engine.runner import ModelRunner, RankItem
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV


class NullRunner(ModelRunner):
    """`ModelRunner` with free passes: right-sized, unfilled prefixes and zero scores."""

    def build_sync(
        self,
        events: Events,
        background: bool,
        base: PrefixKV | None = None,
        *,
        between_chunks: Callable[[], None] = lambda: None,
    ) -> PrefixKV:
        preset = self.model.preset
        length = len(events) * preset.tokens_per_event + (0 if base is None else base.length)
        return PrefixKV.empty(
            preset.num_layers, 1, preset.num_heads, length, preset.head_dim, preset.dtype, self.device
        )

    def rank_sync(self, prefix: PrefixKV, short: Events, candidates: Sequence[int]) -> list[float]:
        return [0.0] * len(candidates)

    def rank_batch_sync(self, items: list[RankItem]) -> list[list[float]]:
        return [[0.0] * len(candidates) for _, _, candidates in items]


class NullModelRankerApp(RankerApp):
    runner_class = NullRunner


def stand_in_main(
    config_class: type[RankerConfig],
    app_class: Callable[..., RankerApp],
    argv: Sequence[str] | None,
    label: str,
    description: str,
) -> None:
    """A stand-in ranker's command line: the ranker's own, its log lines named `label[instance]`."""
    service_main(
        config_class, app_class, argv, "ranker", description,
        log_name=lambda config: f"{label}[{config.instance_name}]",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    stand_in_main(
        RankerConfig, NullModelRankerApp, argv, "null-model-ranker",
        "A ranker whose model passes are free (bench.micro.serving's capacity sweep; its scores mean "
        "nothing)",
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
