"""The pieces of an HSTU family member that hold weights: the layer, the head and the item index.

They compute token-local things only (projections, norms, the residual update, the head): which token sees
which, and at what position, is the contract of `hstu.py`, which composes them. Each piece follows its
`family.ModelConfig` options; at the defaults it computes exactly what our own model always computed (same
operations in the same order, so a preset's scores are bit-identical).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from services.ranker.model.family import ModelConfig

# recsys-examples' floor on the candidate state's L2 norm before its MLP head.
L2_NORM_FLOOR = 1e-6


class HSTULayer(nn.Module):
    """One HSTU layer, split around its attention so the full and the cached paths share the weights:
    `project` gives u and the heads' q, k, v; `finish` is the residual update from u and the attention output.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.silu = config.silu
        self.concat = config.output == "concat"
        self.residual = config.residual
        width = config.num_heads * config.head_dim
        self.input_norm = nn.LayerNorm(
            config.embed_dim, eps=config.input_norm_eps, elementwise_affine=config.input_norm_affine
        )
        # Fused projection, its output laid out [u | v | q | k], each head-major (recsys-examples' fused
        # layer has the same layout, transposed).
        self.uvqk = nn.Linear(config.embed_dim, 4 * width, bias=config.uvqk_bias)
        self.attn_out_norm = nn.LayerNorm(width, eps=config.attn_out_norm_eps)
        self.output = nn.Linear(
            3 * width if self.concat else width, config.embed_dim, bias=config.output_bias
        )

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """u [B, n, H·dv] and q, k, v [B, H, n, d] of tokens x [B, n, D]."""
        batch, n, _ = x.shape
        mixed = self.uvqk(self.input_norm(x))
        if self.silu == "uvqk":
            u, v, q, k = F.silu(mixed).chunk(4, dim=-1)
        else:
            parts = dict(zip("uvqk", mixed.chunk(4, dim=-1), strict=True))
            u, v, q, k = (F.silu(parts[name]) if name in self.silu else parts[name] for name in "uvqk")

        def heads(t: Tensor) -> Tensor:
            return t.reshape(batch, n, self.num_heads, self.head_dim).transpose(1, 2)

        return u, heads(q), heads(k), heads(v)

    def finish(self, x: Tensor, u: Tensor, o: Tensor) -> Tensor:
        """The residual update of x from its gate u and its attention output o [B, H, n, dv]."""
        batch, n, _ = x.shape
        o = o.transpose(1, 2).reshape(batch, n, self.num_heads * self.head_dim)
        gated = u * self.attn_out_norm(o)
        update = self.output(torch.cat([u, o, gated], dim=-1) if self.concat else gated)
        return x + update if self.residual else update


def build_head(config: ModelConfig) -> tuple[nn.LayerNorm | None, nn.Sequential]:
    """The head's final norm (None for "l2_mlp") and MLP; `head_logits` applies them.

    "hstu" (ours): an MLP (Linear, SiLU, Linear) over LayerNorm(h) ⊙ the candidate's item embedding.
    "l2_mlp" (recsys-examples): h / max(|h|, 1e-6), then Linear layers of `head_hidden` widths with
    `head_act` between them and a last Linear to the tasks. (Two objects, not one module, so that our own
    model's state_dict keys, `final_norm.*` and `head.*`, are the ones its checkpoints have.)
    """
    dim, tasks = config.embed_dim, config.num_tasks
    if config.head == "hstu":
        return nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, tasks))
    act = nn.ReLU if config.head_act == "relu" else nn.GELU
    widths = [dim, *config.head_hidden, tasks]
    layers: list[nn.Module] = []
    for index, (inp, out) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(inp, out, bias=config.head_bias))
        if index < len(widths) - 2:
            layers.append(act())
    return None, nn.Sequential(*layers)


def head_logits(
    final_norm: nn.LayerNorm | None, mlp: nn.Sequential, hidden: Tensor, item: Tensor | None
) -> Tensor:
    """Task logits [B, C, T] (float32) from the candidates' last hidden states [B, C, D]; `item` [B, C, D]
    (the candidates' item embeddings) is read by the "hstu" head only."""
    if final_norm is not None:
        return mlp(final_norm(hidden) * item).float()
    norm = torch.linalg.vector_norm(hidden, ord=2, dim=-1, keepdim=True).clamp(min=L2_NORM_FLOOR)
    return mlp(hidden / norm).float()


class UnknownItemError(ValueError):
    """An item id that is not a row (nor a key) of an imported item table."""

    def __init__(self, item_id: int, how: str) -> None:
        super().__init__(f"unknown item id {item_id}: {how}")
        self.item_id = item_id


class ItemIndex(nn.Module):
    """Item ids to rows of the item table.

    "hashed" (ours): remainder modulo the (prime) row count, exact on int64 on every backend, so any id has a
    row. "rows": the id is the row of a trained table. "keys": a dynamic table's keys, sorted, stored with the
    weights (`keys` buffer); the row of key i is i. For the last two an id without a row is refused by name —
    never a silent zero row.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kind = config.item_ids
        self.rows_count = config.item_buckets
        if self.kind == "keys":
            self.register_buffer("keys", torch.zeros(config.item_buckets, dtype=torch.int64))

    def forward(self, item_ids: Tensor) -> Tensor:
        if self.kind == "hashed":
            return torch.remainder(item_ids, self.rows_count)
        if self.kind == "rows":
            bad = (item_ids < 0) | (item_ids >= self.rows_count)
            if bool(bad.any()):
                raise UnknownItemError(
                    int(item_ids[bad][0]), f"not a row of the {self.rows_count}-row item table"
                )
            return item_ids
        ids = item_ids.to(self.keys.device)
        rows = torch.searchsorted(self.keys, ids).clamp_(max=self.rows_count - 1)
        bad = self.keys[rows] != ids
        if bool(bad.any()):
            raise UnknownItemError(int(ids[bad][0]), "not a key of the item table")
        return rows.to(item_ids.device)

    def sample(self, rng, n: int):
        """`n` item ids that have rows (an int64 host array from numpy Generator `rng`), for warm-ups."""
        if self.kind == "hashed":
            return rng.integers(0, 2**40, n)
        rows = rng.integers(0, self.rows_count, n)
        return rows if self.kind == "rows" else self.keys.cpu().numpy()[rows]

    def unknown(self, item_ids) -> int | None:
        """The first id of an int64 host array without a row, or None (the servicer's check)."""
        if self.kind == "hashed" or len(item_ids) == 0:
            return None
        ids = torch.as_tensor(item_ids, dtype=torch.int64)
        if self.kind == "rows":
            bad = (ids < 0) | (ids >= self.rows_count)
        else:
            keys = self.keys.cpu()
            bad = keys[torch.searchsorted(keys, ids).clamp_(max=self.rows_count - 1)] != ids
        return int(ids[bad][0]) if bool(bad.any()) else None
