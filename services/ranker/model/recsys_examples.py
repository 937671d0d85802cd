"""Reads an HSTU ranking checkpoint trained with NVIDIA recsys-examples (`examples/hstu`, read at commit
43465aeabf61515e28d74cbb5234ff7c627dcc19) into our model family (`ModelConfig` and a state_dict),
which `python -m services.ranker.convert` writes as a model directory (`model/store.py`) that
`python -m services.ranker --checkpoint DIR` serves, with relay.

What their training saves (`examples/commons/checkpoint/checkpoint.py`): PATH/torch_module/model.0.pth, a dict
whose `model_state_dict` is the RankingGR module's state_dict, and PATH/dynamicemb_module/<collection>/ with
`<table>_emb_keys.rank_R.world_size_W` (int64) and `<table>_emb_values.rank_R.world_size_W` (float32 rows)
for dynamic tables. The dense part is their FUSED layer layout (`modules/fused_hstu_layer.py`), per layer i
under `_hstu_block._attention_layers.i.`: `_linear_uvqk_weight` [D, 4·H·d] (transposed; columns u|v|q|k,
each head-major, the layout of our `uvqk`), `_linear_uvqk_bias`, `_linear_proj_weight` [H·d, D] (no bias),
`_input_layernorm_weight/bias` (absent when not learnable), `_output_layernorm_weight/bias`; the position
table `_hstu_block._preprocessor._positional_encoder._position_embeddings_weight` [K, D]; the head
`_mlp._mlp.{0,2,..}.weight/bias`. Tables are static model-parallel
(`_embedding_collection._model_parallel_embedding_collection.embeddings.<name>.weight` [V, D]), fused
data-parallel (`_embedding_collection._data_parallel_embedding_collection.embeddings.<a/b/..>_weights`, one
flat tensor holding the named tables in order), or dynamicemb dumps. Dense weights may be bf16.

Their inference forward (`modules/hstu_processor.py`, `modules/position_encoder.py`,
`modules/paged_hstu_infer_layer.py`) is a closed member of our family: each history event an item token
then an action token, candidates item tokens, content times √D plus a forward position clamped at the table's
end (candidates at the position after the history), LayerNorm(eps) → Linear+bias → SiLU on u, v, q, k →
pointwise attention SiLU(q·kᵀ/√d)/scaling_seqlen → u ⊙ LayerNorm(o) → Linear without bias + residual; the
candidates' states L2-normalised then the MLP head. CFG.json gives what the checkpoint does not hold (see
`CONFIG_FIELDS`).

Refused, by name: scaling_seqlen -1 (their batch-max normaliser), contextual tables (not wired; their
contextual tokens see the whole history), time encoding, item/contextual preprocessing MLPs, their unfused
(native) layer layout, any key or shape that does not fit. Assumed, since neither the checkpoint nor CFG.json
says otherwise: target_group_size 1 and causal attention (their ranking defaults), residual on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from services.ranker.model.family import DTYPES, ModelConfig, NotClosedError

CONFIG_FIELDS = {
    "heads": "attention heads H (the checkpoint holds H·d only)",
    "scaling_seqlen": "their fixed attention normaliser (-1, the batch's longest sequence, cannot relay)",
    "eps": "LayerNorm eps of the input and output norms (their layernorm_epsilon)",
    "act": "the head MLP's activation: relu or gelu",
    "item_table": "name of the item embedding table",
    "action_table": "name of the action embedding table",
    "contextual_tables": "contextual feature tables, a list (must be empty: contextual tokens are not wired)",
    "vocab": "rows per table, by name",
    "task": "optional: the task whose sigmoid is the score (default 0)",
    "dtype": "optional: the served compute dtype, float32 (default) or bfloat16",
    "max_events": "optional: most prefix + short-term events of a request (default 16383)",
    "name": "optional: the model's name (default recsys-hstu)",
}
REQUIRED = (
    "heads",
    "scaling_seqlen",
    "eps",
    "act",
    "item_table",
    "action_table",
    "contextual_tables",
    "vocab",
)

LAYER = "_hstu_block._attention_layers."
POSITIONS = "_hstu_block._preprocessor._positional_encoder._position_embeddings_weight"
TIMESTAMPS = "_hstu_block._preprocessor._positional_encoder._timestamp_embeddings_weight"
HEAD = "_mlp._mlp."
MODEL_PARALLEL = "_embedding_collection._model_parallel_embedding_collection.embeddings."
DATA_PARALLEL = "_embedding_collection._data_parallel_embedding_collection.embeddings."
IGNORED = ("_loss_module.", "_metric_module.")


class ConvertError(ValueError):
    """A checkpoint or config that does not fit; the message names the key, shape or field."""


@dataclass
class Table:
    rows: Tensor  # [V, D] float32
    keys: Tensor | None = None  # dynamicemb keys of the rows (sorted), None for a static table


def read_config(path: str | Path) -> dict[str, Any]:
    import json

    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConvertError(f"{path}: cannot read the config: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    unknown = sorted(set(cfg) - set(CONFIG_FIELDS))
    if unknown:
        raise ConvertError(
            f"{path}: unknown field(s) {', '.join(unknown)}; known: {', '.join(CONFIG_FIELDS)}"
        )
    missing = [name for name in REQUIRED if name not in cfg]
    if missing:
        raise ConvertError(f"{path}: missing field(s) {', '.join(missing)}")
    checks = {
        "heads": lambda v: isinstance(v, int) and v > 0,
        "scaling_seqlen": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "eps": lambda v: isinstance(v, (int, float)) and v > 0,
        "act": lambda v: v in ("relu", "gelu"),
        "item_table": lambda v: isinstance(v, str) and v,
        "action_table": lambda v: isinstance(v, str) and v,
        "contextual_tables": lambda v: isinstance(v, list),
        "vocab": lambda v: isinstance(v, dict) and all(isinstance(n, int) and n > 0 for n in v.values()),
        "task": lambda v: isinstance(v, int) and v >= 0,
        "dtype": lambda v: v in ("float32", "bfloat16"),
        "max_events": lambda v: isinstance(v, int) and v > 0,
        "name": lambda v: isinstance(v, str) and v,
    }
    for name, ok in checks.items():
        if name in cfg and not ok(cfg[name]):
            raise ConvertError(f"{path}: field {name!r} = {cfg[name]!r} does not fit: {CONFIG_FIELDS[name]}")
    return cfg


def load_state(path: str | Path) -> tuple[dict[str, Tensor], Path | None]:
    """Their model_state_dict, and the checkpoint directory (None when PATH is the .pth itself)."""
    path = Path(path)
    root = path if path.is_dir() else None
    file = path / "torch_module" / "model.0.pth" if root else path
    if not file.is_file():
        raise ConvertError(
            f"{file}: not found (expected a checkpoint directory with torch_module/model.0.pth)"
        )
    try:
        saved = torch.load(file, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise ConvertError(f"{file}: cannot be loaded with weights_only=True: {exc}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model_state_dict"), dict):
        raise ConvertError(f"{file}: expected a dict with key 'model_state_dict'")
    state = saved["model_state_dict"]
    bad = [k for k, v in state.items() if not isinstance(v, Tensor)]
    if bad:
        raise ConvertError(f"{file}: key {bad[0]!r} of model_state_dict is not a tensor")
    return state, root


def dynamic_tables(root: Path | None, dim: int) -> dict[str, Table]:
    """Tables dumped by dynamicemb under root/dynamicemb_module (all ranks merged, rows sorted by key)."""
    if root is None or not (root / "dynamicemb_module").is_dir():
        return {}
    pattern = re.compile(r"(.+)_emb_keys\.rank_(\d+)\.world_size_(\d+)$")
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for key_file in sorted((root / "dynamicemb_module").rglob("*_emb_keys.rank_*")):
        match = pattern.match(key_file.name)
        if not match:
            continue
        name = match.group(1)
        value_file = key_file.with_name(key_file.name.replace("_emb_keys.", "_emb_values.", 1))
        if not value_file.is_file():
            raise ConvertError(f"{key_file}: no matching {value_file.name}")
        keys = np.fromfile(key_file, dtype=np.int64)
        values = np.fromfile(value_file, dtype=np.float32)
        if values.size != keys.size * dim:
            raise ConvertError(
                f"{value_file}: {values.size} floats for {keys.size} keys of dimension {dim} "
                f"(expected {keys.size * dim})"
            )
        parts.setdefault(name, []).append((keys, values.reshape(keys.size, dim)))
    tables = {}
    for name, chunks in parts.items():
        keys = np.concatenate([k for k, _ in chunks])
        values = np.concatenate([v for _, v in chunks])
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        if keys.size > 1 and not (keys[1:] > keys[:-1]).all():
            raise ConvertError(f"dynamicemb table {name!r}: duplicate keys")
        tables[name] = Table(torch.from_numpy(values.copy()), torch.from_numpy(keys.copy()))
    return tables


def find_table(
    state: dict[str, Tensor], dynamic: dict[str, Table], name: str, vocab: dict, dim: int
) -> Table:
    """Table `name` from a dynamicemb dump, a model-parallel key or a fused data-parallel key."""
    if name in dynamic:
        return dynamic[name]
    rows = vocab.get(name)
    key = f"{MODEL_PARALLEL}{name}.weight"
    if key in state:
        table = state[key]
        if table.dim() != 2 or table.shape[1] != dim or (rows is not None and table.shape[0] != rows):
            raise ConvertError(f"key {key!r} is {list(table.shape)}, expected [{rows or 'V'}, {dim}]")
        return Table(table.float())
    for fused, flat in state.items():
        if not (fused.startswith(DATA_PARALLEL) and fused.endswith("_weights")):
            continue
        names = fused[len(DATA_PARALLEL) : -len("_weights")].split("/")
        if name not in names:
            continue
        missing = [n for n in names if n not in vocab]
        if missing:
            raise ConvertError(
                f"key {fused!r} fuses tables {names}: field 'vocab' must give rows of {missing}"
            )
        sizes = [vocab[n] * dim for n in names]
        if flat.numel() != sum(sizes):
            raise ConvertError(
                f"key {fused!r} has {flat.numel()} elements, expected {sum(sizes)} for tables {names} of "
                f"rows {[vocab[n] for n in names]} and dimension {dim}"
            )
        split = torch.split(flat.reshape(-1), sizes)
        return Table(split[names.index(name)].reshape(vocab[name], dim).float())
    raise ConvertError(
        f"table {name!r} not found: no dynamicemb dump, no key {key!r}, no fused key "
        f"{DATA_PARALLEL}<...>_weights naming it"
    )


def _take(state: dict[str, Tensor], used: set[str], key: str, shape: Sequence[int]) -> Tensor:
    if key not in state:
        raise ConvertError(f"missing key {key!r}")
    tensor = state[key]
    if list(tensor.shape) != list(shape):
        raise ConvertError(f"key {key!r} is {list(tensor.shape)}, expected {list(shape)}")
    used.add(key)
    return tensor


def convert_recsys_examples(path: str | Path, cfg: dict[str, Any]) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Our config and state_dict of their checkpoint (see the module docstring)."""
    state, root = load_state(path)
    if cfg["contextual_tables"]:
        raise NotClosedError(
            f"config field 'contextual_tables' = {cfg['contextual_tables']}: contextual tokens are not part "
            "of the Rank/PreInfer contract, and recsys-examples lets them attend to the whole history "
            "(not closed)"
        )
    if cfg["scaling_seqlen"] <= 0:
        raise NotClosedError(
            f"config field 'scaling_seqlen' = {cfg['scaling_seqlen']}: -1 normalises by the batch's "
            "longest sequence, so a prefix's states depend on the batch; train and serve with a fixed "
            "scaling_seqlen"
        )
    if TIMESTAMPS in state:
        raise NotClosedError(
            f"key {TIMESTAMPS!r}: time encoding buckets timestamps against the request, so prefix tokens "
            "depend on the request time; train with use_time_encoding=False"
        )
    for key in state:
        if key.startswith("_hstu_block._preprocessor.") and key != POSITIONS:
            raise ConvertError(f"key {key!r}: preprocessing MLPs (item/contextual) are not supported")
        if key.startswith(LAYER) and key.endswith("_linear_uvqk.weight"):
            raise ConvertError(
                f"key {key!r}: the native (unfused, per-head interleaved) layer layout is not supported; "
                "train with the fused layer (hstu_layer_type FUSED)"
            )
    used: set[str] = set()
    heads = cfg["heads"]
    first = f"{LAYER}0._linear_uvqk_weight"
    if first not in state:
        raise ConvertError(f"missing key {first!r} (their fused HSTU layer)")
    dim, fused_width = state[first].shape
    if fused_width % (4 * heads):
        raise ConvertError(
            f"key {first!r} is {[dim, fused_width]}: {fused_width} is not 4 x heads ({heads}) x d"
        )
    head_dim = fused_width // (4 * heads)
    width = heads * head_dim
    num_layers = 0
    while f"{LAYER}{num_layers}._linear_uvqk_weight" in state:
        num_layers += 1
    affine = f"{LAYER}0._input_layernorm_weight" in state
    ours: dict[str, Tensor] = {}
    for i in range(num_layers):
        theirs, mine = f"{LAYER}{i}.", f"layers.{i}."
        if affine:
            ours[mine + "input_norm.weight"] = _take(state, used, theirs + "_input_layernorm_weight", [dim])
            ours[mine + "input_norm.bias"] = _take(state, used, theirs + "_input_layernorm_bias", [dim])
        ours[mine + "uvqk.weight"] = _take(state, used, theirs + "_linear_uvqk_weight", [dim, 4 * width]).T
        ours[mine + "uvqk.bias"] = _take(state, used, theirs + "_linear_uvqk_bias", [4 * width])
        ours[mine + "attn_out_norm.weight"] = _take(state, used, theirs + "_output_layernorm_weight", [width])
        ours[mine + "attn_out_norm.bias"] = _take(state, used, theirs + "_output_layernorm_bias", [width])
        ours[mine + "output.weight"] = _take(state, used, theirs + "_linear_proj_weight", [width, dim]).T
    leftover = sorted(k for k in state if k.startswith(LAYER) and k not in used)
    if leftover:
        raise ConvertError(f"unexpected key {leftover[0]!r} in their layers")
    has_positions = POSITIONS in state
    if has_positions:
        table = state[POSITIONS]
        if table.dim() != 2 or table.shape[1] != dim:
            raise ConvertError(f"key {POSITIONS!r} is {list(table.shape)}, expected [K, {dim}]")
        ours["position_embedding.weight"] = _take(state, used, POSITIONS, table.shape)
    # The head: Linear layers at even indices of their MLP's Sequential (activations between them).
    widths, head_bias, index = [dim], f"{HEAD}0.bias" in state, 0
    while f"{HEAD}{index}.weight" in state:
        weight = _take(
            state, used, f"{HEAD}{index}.weight", [state[f"{HEAD}{index}.weight"].shape[0], widths[-1]]
        )
        ours[f"head.{index}.weight"] = weight
        if head_bias:
            ours[f"head.{index}.bias"] = _take(state, used, f"{HEAD}{index}.bias", [weight.shape[0]])
        widths.append(weight.shape[0])
        index += 2
    if len(widths) < 2:
        raise ConvertError(f"missing key {HEAD}0.weight (their prediction head)")
    leftover = sorted(k for k in state if k.startswith(HEAD) and k not in used)
    if leftover:
        raise ConvertError(f"unexpected key {leftover[0]!r} in their prediction head")
    dynamic = dynamic_tables(root, dim)
    items = find_table(state, dynamic, cfg["item_table"], cfg["vocab"], dim)
    actions = find_table(state, dynamic, cfg["action_table"], cfg["vocab"], dim)
    if actions.keys is not None and not torch.equal(actions.keys, torch.arange(len(actions.keys))):
        raise ConvertError(
            f"dynamic action table {cfg['action_table']!r}: keys must be 0 .. n-1 (action types)"
        )
    ours["item_embedding.weight"] = items.rows
    ours["action_embedding.weight"] = actions.rows
    if items.keys is not None:
        ours["item_index.keys"] = items.keys
    num_tasks = widths[-1]
    task = cfg.get("task", 0)
    if task >= num_tasks:
        raise ConvertError(f"config field 'task' = {task}, but the head has {num_tasks} task outputs")
    dtype = DTYPES[cfg.get("dtype", "float32")]
    positions = ours["position_embedding.weight"].shape[0] if has_positions else 2
    config = ModelConfig(
        name=cfg.get("name", "recsys-hstu"),
        embed_dim=dim,
        num_heads=heads,
        head_dim=head_dim,
        num_layers=num_layers,
        dtype=dtype,
        num_tasks=num_tasks,
        item_buckets=items.rows.shape[0],
        num_action_types=actions.rows.shape[0],
        max_positions=positions,
        attn_norm=float(cfg["scaling_seqlen"]),
        item_ids="keys" if items.keys is not None else "rows",
        input_norm_eps=float(cfg["eps"]),
        input_norm_affine=affine,
        attn_out_norm_eps=float(cfg["eps"]),
        # Their positional encoder scales the content by √D; without one there is no scale.
        embed_scale=float(dim) ** 0.5 if has_positions else 1.0,
        output_bias=False,
        token_layout="item_action",
        positions=has_positions,
        position_clamp=True,
        event_limit=cfg.get("max_events", 16383),
        candidate_token="item",
        head="l2_mlp",
        head_hidden=tuple(widths[1:-1]),
        head_act=cfg["act"],
        head_bias=head_bias,
        score_task=task,
    )
    state_out = {
        name: tensor if name == "item_index.keys" else tensor.to(dtype).contiguous()
        for name, tensor in ours.items()
    }
    return config, state_out
