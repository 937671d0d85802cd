"""`bench.micro.null_model`: a ranker whose model passes are free, for `bench.micro.serving`. Its scores
mean nothing: never serve it.

Everything but the model is the ranker's own, built by `RankerApp` from the same flags (server, validation,
the prefix cache with its tiers, leases and budgets, the scheduler, the device and copy threads, metrics);
a prefix is a KV buffer of its true size, filled with nothing, and a rank's scores are zeros. What it
sustains is the serving path's own capacity, the ceiling a faster accelerator meets.
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


def stand_in_main(config_class: type[RankerConfig], app_class: Callable, label: str, doc: str) -> None:
    """A stand-in ranker's command line: the ranker's own, its log lines named `label[instance]`."""

    def log_name(config: RankerConfig) -> str:
        return f"{label}[{config.instance_name}]"

    service_main(config_class, app_class, sys.argv[1:], "ranker", doc.split("\n\n")[0], log_name=log_name)


if __name__ == "__main__":  # as `services.launcher` starts it
    stand_in_main(RankerConfig, NullModelRankerApp, "null-model-ranker", __doc__)
