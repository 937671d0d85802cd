"""Test helpers for NVIDIA recsys-examples HSTU checkpoints (examples/hstu at commit
43465aeabf61515e28d74cbb5234ff7c627dcc19): an independent fp32 reference of THEIR inference forward for one
user, over the tensors `bench.lib.recsys_checkpoints.write_checkpoint` returns (the writer of
random checkpoints in their layout).

The reference is written from their inference code, not from ours: `hstu_preprocess_embeddings` (history
events interleaved item then action, candidates item tokens only), `HSTUPositionalEncoder.forward` and
`_add_position_embeddings_kernel` (content x sqrt(D), plus the position table at min(token index, high_ind)
with high_ind = min(history tokens, K - 1)), `PagedHSTUInferLayer.forward_naive` (LayerNorm with eps -> Linear
with bias -> SiLU -> split u|v|q|k -> attention -> u * LayerNorm(o) -> Linear without bias + residual),
`pytorch_hstu_mha` and `_get_valid_attn_mask` in `ops/pt_ops/pt_hstu_attention.py` (SiLU(alpha q k^T) /
scaling_seqlen under the causal mask with targets seeing the history and themselves) and
`HSTUBlockPostprocessor` + `MLP` (candidates' states L2-normalised, floor 1e-6, then Linear/act layers). It
loops over tokens where their kernels do, so it shares no code path with `services.ranker.model`'s reader or
model (the key names are the writer's, spelled from their code).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bench.lib.recsys_checkpoints import LAYER, POSITIONS


def reference_scores(
    ckpt: dict, cfg: dict, history: list[tuple[int, int]], candidates: list[int], task: int = 0
) -> Tensor:
    """sigmoid(logit[task]) of each candidate for one user whose history (item id, action) is `history`,
    computed as their inference forward computes it (see the module docstring), in fp32."""
    dense, heads = ckpt["dense"], ckpt["heads"]
    eps, scaling = cfg["eps"], cfg["scaling_seqlen"]

    def row(item_id: int) -> Tensor:
        if ckpt["keys"] is None:
            return ckpt["item"][item_id]
        return ckpt["item"][int(np.flatnonzero(ckpt["keys"] == item_id)[0])]

    # hstu_preprocess_embeddings (inference): [item_0, action_0, item_1, action_1, ..., candidates].
    tokens = []
    for item_id, action in history:
        tokens += [row(item_id), ckpt["action"][action]]
    num_history = len(tokens)
    tokens += [row(c) for c in candidates]
    x = torch.stack(tokens)
    n, dim = x.shape
    if POSITIONS in dense:  # HSTUPositionalEncoder, no time encoding
        table = dense[POSITIONS]
        high = min(num_history, table.shape[0] - 1)
        x = torch.stack([x[i] * math.sqrt(dim) + table[min(i, high)] for i in range(n)])
    # _get_valid_attn_mask(causal=True, num_targets=C, target_group_size=1), no contextual tokens.
    # A token sees itself and every earlier token, except that a candidate (target) sees no other target.
    mask = torch.zeros(n, n)
    for i in range(n):
        for j in range(n):
            mask[i, j] = float(i == j or (i > j and j < num_history))
    layer = 0
    while LAYER.format(layer) + "_linear_uvqk_weight" in dense:
        p = LAYER.format(layer)
        w_in = dense.get(p + "_input_layernorm_weight")
        b_in = dense.get(p + "_input_layernorm_bias")
        normed = F.layer_norm(x, [dim], w_in, b_in, eps)
        mixed = F.silu(normed @ dense[p + "_linear_uvqk_weight"] + dense[p + "_linear_uvqk_bias"])
        width = mixed.shape[1] // 4
        u, v, q, k = torch.split(mixed, [width] * 4, dim=-1)
        head_dim = width // heads
        q, k, v = (t.view(n, heads, head_dim).transpose(0, 1) for t in (q, k, v))
        attn = F.silu(torch.einsum("hxa,hya->hxy", q, k) * head_dim**-0.5) / scaling
        o = torch.einsum("hxy,hyv->hxv", attn * mask, v).transpose(0, 1).reshape(n, width)
        gated = u * F.layer_norm(o, [width], dense[p + "_output_layernorm_weight"],
                                 dense[p + "_output_layernorm_bias"], eps)  # fmt: skip
        x = gated @ dense[p + "_linear_proj_weight"] + x
        layer += 1
    # HSTUBlockPostprocessor: the candidates' states, L2-normalised; then the MLP head.
    h = x[num_history:]
    h = h / torch.linalg.norm(h, ord=2, dim=-1, keepdim=True).clamp(min=1e-6)
    j = 0
    while f"_mlp._mlp.{j}.weight" in dense:
        h = h @ dense[f"_mlp._mlp.{j}.weight"].T + dense[f"_mlp._mlp.{j}.bias"]
        if f"_mlp._mlp.{j + 2}.weight" in dense:
            h = torch.relu(h) if cfg["act"] == "relu" else F.gelu(h)
        j += 2
    return torch.sigmoid(h[:, task])
