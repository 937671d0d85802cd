"""Writes random HSTU checkpoints in NVIDIA recsys-examples' layout (examples/hstu, at the commit that
`services.ranker.model.recsys_examples` names), for what has no trained checkpoint: the tests of that
reader and the DRAM precisions' error table (`python -m bench accelerator --measures dram-precision`).

It follows what their training saves (`examples/commons/checkpoint/checkpoint.py`: `model_state_dict` in
torch_module/model.0.pth, dynamicemb dumps under dynamicemb_module/) with the key names of their RankingGR
and fused HSTU layer and the dump file names of dynamicemb, spelled here from their code rather than read
from the reader's constants, so that a mistake in the reader is not written into the checkpoints that test it.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

LAYER = "_hstu_block._attention_layers.{}."
POSITIONS = "_hstu_block._preprocessor._positional_encoder._position_embeddings_weight"
MODEL_PARALLEL = "_embedding_collection._model_parallel_embedding_collection.embeddings.{}.weight"
DATA_PARALLEL = "_embedding_collection._data_parallel_embedding_collection.embeddings.{}_weights"
DYNAMIC_DIR = "_embedding_collection._model_parallel_embedding_collection"


def cfg_for(*, heads=2, scaling_seqlen=64, eps=1e-5, act="relu", items=50, actions=6, extra=None) -> dict:
    """A converter config (CFG.json) for tables named item/action (and `extra`: another table's rows)."""
    vocab = {"item": items, "action": actions, **(extra or {})}
    return dict(heads=heads, scaling_seqlen=scaling_seqlen, eps=eps, act=act, item_table="item",
                action_table="action", contextual_tables=[], vocab=vocab)  # fmt: skip


def write_checkpoint(
    root: Path,
    cfg: dict,
    *,
    dim: int = 16,
    head_dim: int = 8,
    layers: int = 2,
    positions: int = 40,
    head: tuple[int, ...] = (12, 2),
    tables: str = "model_parallel",
    dense_dtype: torch.dtype = torch.bfloat16,
    learnable_input_norm: bool = True,
    seed: int = 0,
    dynamic_keys: np.ndarray | None = None,
) -> dict:
    """Writes root/torch_module/model.0.pth (and dynamicemb dumps for tables="dynamic") with random weights in
    their layout; returns the fp32 tensors the reference reads (`tables` holds item/action rows, `keys` the
    item keys of a dynamic table)."""
    g = torch.Generator().manual_seed(seed)
    heads, width = cfg["heads"], cfg["heads"] * head_dim

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dense_dtype)

    state: dict[str, Tensor] = {}
    for i in range(layers):
        p = LAYER.format(i)
        if learnable_input_norm:
            state[p + "_input_layernorm_weight"] = (1 + rand(dim, scale=0.1)).to(dense_dtype)
            state[p + "_input_layernorm_bias"] = rand(dim, scale=0.1)
        state[p + "_linear_uvqk_weight"] = rand(dim, 4 * width, scale=dim**-0.5)
        state[p + "_linear_uvqk_bias"] = rand(4 * width, scale=0.1)
        state[p + "_output_layernorm_weight"] = (1 + rand(width, scale=0.1)).to(dense_dtype)
        state[p + "_output_layernorm_bias"] = rand(width, scale=0.1)
        state[p + "_linear_proj_weight"] = rand(width, dim, scale=width**-0.5)
    if positions:
        state[POSITIONS] = torch.empty(positions, dim).uniform_(
            -(positions**-0.5), positions**-0.5, generator=g
        )
    widths = [dim, *head]
    for j, (inp, out) in enumerate(itertools.pairwise(widths)):
        state[f"_mlp._mlp.{2 * j}.weight"] = rand(out, inp, scale=inp**-0.5)
        state[f"_mlp._mlp.{2 * j}.bias"] = rand(out, scale=0.1)
    vocab = cfg["vocab"]
    item_rows = torch.randn(vocab["item"], dim, generator=g) * 0.1
    action_rows = torch.randn(vocab["action"], dim, generator=g) * 0.1
    root.mkdir(parents=True, exist_ok=True)
    keys = None
    if tables == "model_parallel":
        state[MODEL_PARALLEL.format("item")] = item_rows
        state[MODEL_PARALLEL.format("action")] = action_rows
    elif tables == "data_parallel":
        # One flat tensor of the fused tables, in the order its name lists them (an unused table between).
        other = torch.randn(vocab["other"], dim, generator=g)
        flat = torch.cat([action_rows.reshape(-1), other.reshape(-1), item_rows.reshape(-1)])
        state[DATA_PARALLEL.format("action/other/item")] = flat
    elif tables == "dynamic":
        state[MODEL_PARALLEL.format("action")] = action_rows
        keys = (
            dynamic_keys if dynamic_keys is not None else np.arange(vocab["item"], dtype=np.int64) * 1000 + 7
        )
        directory = root / "dynamicemb_module" / DYNAMIC_DIR
        directory.mkdir(parents=True, exist_ok=True)
        # Two ranks, keys unsorted (as a hash table dumps them).
        order = np.random.default_rng(seed).permutation(len(keys))
        for rank, part in enumerate(np.array_split(order, 2)):
            suffix = f"rank_{rank}.world_size_2"
            keys[part].astype(np.int64).tofile(directory / f"item_emb_keys.{suffix}")
            item_rows[part].numpy().astype(np.float32).tofile(directory / f"item_emb_values.{suffix}")
            np.zeros(len(part), dtype=np.int64).tofile(directory / f"item_emb_scores.{suffix}")
    (root / "torch_module").mkdir(exist_ok=True)
    torch.save(
        {"model_state_dict": state, "optimizer_state_dict": None}, root / "torch_module" / "model.0.pth"
    )
    dense = {k: v.float() for k, v in state.items() if not k.startswith("_embedding_collection")}
    return dict(dense=dense, item=item_rows, action=action_rows, keys=keys, heads=heads, layers=layers)
