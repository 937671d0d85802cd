"""Named shapes of the HSTU ranker. The names are part of the CLI (`--model-preset`).

A preset fixes everything that decides the model's weights and numerics, so `ModelPreset.version` (a digest
of every such field) is what a cached prefix is keyed on: two processes with the same version compute the same
prefix KV. A preset also says how big its cache tiers are by default (`services.ranker.budgets`); those
fields change no numerics, so they are left out of the version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

import torch


def _budget(default: float) -> float:
    """A preset field that sizes the cache tiers: it changes no prefix KV, so it is not in the version."""
    return field(default=default, metadata={"versioned": False})


@dataclass(frozen=True)
class ModelPreset:
    """One model shape; dqk = dv = `head_dim`."""

    name: str
    embed_dim: int
    num_heads: int
    head_dim: int
    num_layers: int
    dtype: torch.dtype
    num_tasks: int = 3
    # Rows of the hashed item-id embedding; a prime, because ids are bucketed by remainder.
    item_buckets: int = 8191
    num_action_types: int = 16
    # Absolute position embedding rows: prefix + short-term + the one shared candidate position must fit.
    max_positions: int = 16384
    # The fixed attention normaliser N_norm. Never the batch's padded length: that would make a prefix's
    # states depend on who else is in the batch and break exact reuse.
    attn_norm: float = 8192.0
    seed: int = 0
    # The budgets `--hbm-budget-mb -1` / `--dram-budget-mb -1` (auto) resolve to (services.ranker.budgets).
    # Fixed MiB: on a CPU device always, and on every device for a preset whose `hbm_share` is 0.
    fixed_hbm_budget_mb: int = _budget(256)
    fixed_dram_budget_mb: int = _budget(1024)
    # On an accelerator, the HBM tier's share of the device memory left free by the model and the working
    # set of the largest request (0: the fixed budgets instead).
    hbm_share: float = _budget(0.0)
    # The auto DRAM tier: this share of the host's memory (the container's limit where lower), at most
    # `dram_hbm_ratio` times the auto HBM budget.
    dram_host_share: float = _budget(0.25)
    dram_hbm_ratio: float = _budget(4.0)

    def __post_init__(self) -> None:
        for name in ("embed_dim", "num_heads", "head_dim", "num_layers", "num_tasks", "item_buckets",
                     "num_action_types"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"preset {self.name!r}: {name} must be positive")
        if self.max_positions < 2:
            raise ValueError(f"preset {self.name!r}: max_positions must fit one event and the candidates")
        if not self.attn_norm > 0:
            raise ValueError(f"preset {self.name!r}: attn_norm must be positive")
        if self.fixed_hbm_budget_mb < 0 or self.fixed_dram_budget_mb < 0:
            raise ValueError(f"preset {self.name!r}: fixed budgets must not be negative")
        if not (0 <= self.hbm_share < 1 and 0 <= self.dram_host_share < 1 and self.dram_hbm_ratio >= 0):
            raise ValueError(f"preset {self.name!r}: budget shares must be in [0, 1), the ratio not negative")

    @property
    def max_events(self) -> int:
        """Most prefix + short-term events one request may carry (one position is the candidates')."""
        return self.max_positions - 1

    @property
    def kv_bytes_per_token(self) -> int:
        """Prefix-KV bytes one token occupies across all layers (keys and values)."""
        return self.num_layers * self.num_heads * 2 * self.head_dim * self.dtype.itemsize

    @property
    def version(self) -> str:
        """Stable model version for cache keys: changes whenever any field does."""
        versioned = (f for f in fields(self) if f.metadata.get("versioned", True))
        payload = repr(tuple((f.name, getattr(self, f.name)) for f in versioned))
        return f"{self.name}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


PRESETS: dict[str, ModelPreset] = {
    preset.name: preset
    for preset in (
        # Unit tests use short sequences, so a small N_norm keeps the history's influence on scores well
        # above float rounding (tests must be able to see a stale prefix).
        ModelPreset("cpu-tiny", embed_dim=32, num_heads=2, head_dim=16, num_layers=2, dtype=torch.float32,
                    attn_norm=256.0),
        ModelPreset("cpu-small", embed_dim=64, num_heads=2, head_dim=32, num_layers=2, dtype=torch.float32),
        ModelPreset("gpu-dlrmv3", embed_dim=512, num_heads=4, head_dim=128, num_layers=5,
                    dtype=torch.bfloat16, item_buckets=100_003, hbm_share=0.6),
    )
}  # fmt: skip


def get_preset(name: str) -> ModelPreset:
    """The preset called `name`; ValueError names the valid ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}") from None
