"""The HSTU model family: one `ModelConfig` describes a member, and it travels with the weights.

A ranker serves the models teams train, so the layer of `hstu.py` is one member of a family. Every structural
option that changes a score is a field here: the shape, the per-norm eps, the embedding scale, the projection
biases, which of u/v/q/k take SiLU, the output form, the token layout, position clamping, the candidate token,
the head. The presets (`presets.py`) are configs of this family with every option at its default, and a
converted checkpoint directory carries its config as `model.json` beside the weights (`store.py`).

`ModelConfig.version` digests every field that changes numerics, so two processes with the same version
compute the same prefix KV. An option at its default is left out of the digest: the presets' versions (and the
caches, results and checkpoints keyed on them) are the ones they had before the family existed.

Closure. Exact prefix reuse needs a *closed* prefix: nothing in a prefix token may depend on anything after
the prefix, on the request time or on the batch. Three input rules that trained models use break that, and a
config that declares one of them is refused when it is built (so at load), naming the option and why:
positions counted back from the end of the history (`position_origin="end"`), time features measured from
the request time (`time_features`), and a normaliser that is the batch's longest sequence
(`attn_norm="batch_max"`).
Contextual (user-feature) tokens at the front of the prefix are not wired into the Rank/PreInfer contract:
`contextual_tokens > 0` is refused too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

ITEM_IDS = ("hashed", "rows", "keys")
OUTPUTS = ("gated", "concat")
TOKEN_LAYOUTS = ("event", "item_action")
CANDIDATE_TOKENS = ("target_action", "item")
HEADS = ("hstu", "l2_mlp")
HEAD_ACTS = ("relu", "gelu")

# The input rules that break prefix closure: option -> (the closed value, why any other value is refused).
NOT_CLOSED = {
    "position_origin": (
        "start",
        "positions counted from the end of the history change every prefix token's position when an event is "
        "appended, so no prefix KV survives the next event; train with positions counted forward from the "
        "start",
    ),
    "time_features": (
        "none",
        "a time feature measured from the request time puts the request time into every prefix token, so a "
        "prefix computed at retrieval is stale at ranking; use event-local features (gaps between events) or "
        "put request-relative time into candidate tokens only",
    ),
    "attn_norm": (
        "a positive constant",
        "a normaliser that is the batch's longest sequence makes a user's prefix states depend on who else "
        "is in the batch; train and serve with a fixed normaliser (recsys-examples' scaling_seqlen)",
    ),
    "contextual_tokens": (
        0,
        "contextual (user-feature) tokens are not part of the Rank/PreInfer contract yet, and "
        "recsys-examples lets them attend to the whole history (not closed); export the model without "
        "contextual features",
    ),
}


class NotClosedError(ValueError):
    """A model whose prefix KV would depend on something after the prefix: it cannot relay."""


def _budget(default: float) -> Any:
    """A field that sizes the cache tiers: it changes no prefix KV, so it is not in the version."""
    return field(default=default, metadata={"versioned": False})


def _option(default: Any) -> Any:
    """A family option: in the version only when it differs from `default` (our own model's choice)."""
    return field(default=default, metadata={"family": True})


@dataclass(frozen=True)
class ModelConfig:
    """One member of the HSTU family; dqk = dv = `head_dim`. Defaults are our own model's choices."""

    name: str
    embed_dim: int
    num_heads: int
    head_dim: int
    num_layers: int
    dtype: torch.dtype
    num_tasks: int = 3
    # Rows of the item table. `item_ids="hashed"`: ids are bucketed by remainder (a prime, then).
    item_buckets: int = 8191
    num_action_types: int = 16
    # Rows of the absolute position table. Without clamping, prefix + short-term tokens and the one shared
    # candidate position must fit.
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

    # ---- family options (see the module docstring; docs/models.md lists them) ----
    # How an item id finds its row: "hashed" (remainder modulo item_buckets: any int64), "rows" (the id is
    # the row: unknown ids refused), "keys" (a sorted key table stored with the weights: unknown refused).
    item_ids: str = _option("hashed")
    input_norm_eps: float = _option(1e-5)
    input_norm_affine: bool = _option(True)
    # On the attention output: N_norm makes it small for short sequences and 1e-5 would swamp its variance.
    attn_out_norm_eps: float = _option(1e-6)
    # Token content (item and action embeddings) times this, then the position embedding added.
    embed_scale: float = _option(1.0)
    uvqk_bias: bool = _option(True)
    output_bias: bool = _option(True)
    # Which of u, v, q, k take SiLU after the projection ("uvqk": all; DLRMv3's layer: "u").
    silu: str = _option("uvqk")
    # "gated": x + W(u * LN(o)); "concat": x + W[u, o, u * LN(o)] (DLRMv3's form).
    output: str = _option("gated")
    residual: bool = _option(True)
    # "event": one token per event (item + action); "item_action": each event an item token then an action
    # token (recsys-examples), candidates one token each.
    token_layout: str = _option("event")
    # Whether there is a position table, and whether positions past its end use its last row.
    positions: bool = _option(True)
    position_clamp: bool = _option(False)
    # Most prefix + short-term events of one request (0: as many as the position table holds).
    event_limit: int = _option(0)
    # "target_action": item + the learned target action row; "item": the item embedding alone.
    candidate_token: str = _option("target_action")
    # "hstu": MLP(LN(h) * item) with SiLU; "l2_mlp": MLP(h / |h|) with `head_act` (recsys-examples).
    head: str = _option("hstu")
    head_hidden: tuple[int, ...] = _option(())
    head_act: str = _option("relu")
    head_bias: bool = _option(True)
    # The task whose sigmoid is the returned score.
    score_task: int = _option(0)
    # Declared input rules; only the closed values load (NOT_CLOSED says why).
    position_origin: str = _option("start")
    time_features: str = _option("none")
    contextual_tokens: int = _option(0)

    def __post_init__(self) -> None:
        self._check_closed()
        for name in ("embed_dim", "num_heads", "head_dim", "num_layers", "num_tasks", "item_buckets",
                     "num_action_types"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"model {self.name!r}: {name} must be positive")
        if self.max_positions < 2:
            raise ValueError(f"model {self.name!r}: max_positions must fit one event and the candidates")
        if self.fixed_hbm_budget_mb < 0 or self.fixed_dram_budget_mb < 0:
            raise ValueError(f"model {self.name!r}: fixed budgets must not be negative")
        if not (0 <= self.hbm_share < 1 and 0 <= self.dram_host_share < 1 and self.dram_hbm_ratio >= 0):
            raise ValueError(f"model {self.name!r}: budget shares must be in [0, 1), the ratio not negative")
        choices = {"item_ids": ITEM_IDS, "output": OUTPUTS, "token_layout": TOKEN_LAYOUTS,
                   "candidate_token": CANDIDATE_TOKENS, "head": HEADS, "head_act": HEAD_ACTS}  # fmt: skip
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"model {self.name!r}: {name} must be one of {', '.join(valid)}")
        if not self.silu or set(self.silu) - set("uvqk") or len(set(self.silu)) != len(self.silu):
            raise ValueError(f"model {self.name!r}: silu must name some of u, v, q, k once each")
        if not (self.input_norm_eps > 0 and self.attn_out_norm_eps > 0 and self.embed_scale > 0):
            raise ValueError(f"model {self.name!r}: norm eps and embed_scale must be positive")
        if any(width < 1 for width in self.head_hidden) or (self.head == "hstu" and self.head_hidden):
            raise ValueError(f"model {self.name!r}: head_hidden lists positive widths, for the l2_mlp head")
        if not 0 <= self.score_task < self.num_tasks:
            raise ValueError(f"model {self.name!r}: score_task must be in [0, num_tasks={self.num_tasks})")
        if self.event_limit < 0 or (self.event_limit > self._position_events and not self.position_clamp):
            raise ValueError(
                f"model {self.name!r}: event_limit {self.event_limit} needs more than the "
                f"{self.max_positions} positions (set position_clamp to reuse the last one)"
            )

    def _check_closed(self) -> None:
        rules = {"position_origin": self.position_origin == "start",
                 "time_features": self.time_features == "none",
                 "attn_norm": isinstance(self.attn_norm, (int, float)) and self.attn_norm > 0,
                 "contextual_tokens": self.contextual_tokens == 0}  # fmt: skip
        for option, closed in rules.items():
            if not closed:
                expected, why = NOT_CLOSED[option]
                raise NotClosedError(
                    f"model {self.name!r} cannot relay: {option}={getattr(self, option)!r} "
                    f"(needs {expected}): {why}"
                )

    # ---- derived shape ----

    @property
    def tokens_per_event(self) -> int:
        return 2 if self.token_layout == "item_action" else 1

    @property
    def _position_events(self) -> int:
        return (self.max_positions - 1) // self.tokens_per_event

    @property
    def max_events(self) -> int:
        """Most prefix + short-term events one request may carry."""
        return self.event_limit or self._position_events

    @property
    def kv_bytes_per_token(self) -> int:
        """Prefix-KV bytes one history event occupies across all layers (keys and values): what the fleet
        counts as a prefix token (two KV rows per event in the item_action layout)."""
        row = self.num_layers * self.num_heads * 2 * self.head_dim * self.dtype.itemsize
        return row * self.tokens_per_event

    @property
    def version(self) -> str:
        """Stable model version for cache keys: changes whenever any field that changes numerics does."""
        versioned = [
            f for f in fields(self) if f.metadata.get("versioned", True) and not f.metadata.get("family")
        ]
        payload = repr(tuple((f.name, getattr(self, f.name)) for f in versioned))
        options = tuple(
            (f.name, getattr(self, f.name))
            for f in fields(self)
            if f.metadata.get("family") and getattr(self, f.name) != f.default
        )
        if options:
            payload += repr(options)
        return f"{self.name}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"

    # ---- model.json ----

    def to_json(self) -> dict[str, Any]:
        """The fields that describe the model (budgets left out), JSON-ready."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if not f.metadata.get("versioned", True):
                continue
            value = getattr(self, f.name)
            out[f.name] = (
                _dtype_name(value)
                if f.name == "dtype"
                else list(value)
                if isinstance(value, tuple)
                else value
            )
        return out

    @classmethod
    def from_json(cls, data: Any, source: str = "model.json") -> ModelConfig:
        """The config of a JSON object; ValueError names the field that does not fit."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object")
        known = {f.name: f for f in fields(cls) if f.metadata.get("versioned", True)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {', '.join(unknown)}")
        missing = [name for name, f in known.items() if f.default is dataclasses.MISSING and name not in data]
        if missing:
            raise ValueError(f"{source}: missing field(s) {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name, raw in data.items():
            f = known[name]
            if name == "dtype":
                if raw not in DTYPES:
                    raise ValueError(f"{source}: dtype must be one of {', '.join(DTYPES)}, got {raw!r}")
                values[name] = DTYPES[raw]
                continue
            default = None if f.default is dataclasses.MISSING else f.default
            values[name] = _coerce(source, name, raw, default)
        return cls(**values)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)


def _coerce(source: str, name: str, raw: Any, default: Any) -> Any:
    """`raw` as the type of the field's default (ints for int fields, etc.); ValueError names the field."""
    if name == "attn_norm" and isinstance(raw, str):
        return raw  # a declared rule such as "batch_max": refused by the closure check, by name
    if isinstance(default, bool) or name in ("uvqk_bias",):
        ok = isinstance(raw, bool)
    elif isinstance(default, tuple):
        ok = isinstance(raw, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in raw)
        raw = tuple(raw) if ok else raw
    elif isinstance(default, float):
        ok = isinstance(raw, (int, float)) and not isinstance(raw, bool)
        raw = float(raw) if ok else raw
    elif isinstance(default, int) or name in ("embed_dim", "num_heads", "head_dim", "num_layers"):
        ok = isinstance(raw, int) and not isinstance(raw, bool)
    else:
        ok = isinstance(raw, str)
    if not ok:
        raise ValueError(f"{source}: field {name!r} has the wrong type: {raw!r}")
    return raw
