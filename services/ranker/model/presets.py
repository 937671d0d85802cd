"""Named shapes of the HSTU ranker. The names are part of the CLI (`--model-preset`).

A preset is a config of the model family (`family.ModelConfig`, with every family option at its default: our
own model). It fixes everything that decides the model's weights and numerics, so `ModelPreset.version` (a
digest of every such field) is what a cached prefix is keyed on: two processes with the same version compute
the same prefix KV. A preset also says how big its cache tiers are by default (`services.ranker.budgets`);
those fields change no numerics, so they are left out of the version.
"""

from __future__ import annotations

import torch

from services.ranker.model.family import ModelConfig

# A preset is a family config; the name stays for the CLI and the code that sizes tiers from it.
ModelPreset = ModelConfig


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
