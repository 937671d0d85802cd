"""A model directory: the weights and the config that describes them, served by `--checkpoint DIR`.

    DIR/model.json   the `family.ModelConfig` (its fields, JSON) — the architecture; no preset flag needed
    DIR/weights.pt   the model's state_dict (torch.save; loaded with weights_only=True)

`services.ranker.convert` writes one from a checkpoint trained elsewhere. Loading checks everything before it
returns: the config (including the closure check), then every tensor's name, shape and dtype against the model
the config builds; anything that does not fit raises ValueError naming the file and the key, field or shape,
and no model is returned half-loaded. The model version is the config's plus a digest of both files.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import torch
from torch import Tensor

from services.ranker.model.family import ModelConfig
from services.ranker.model.hstu import HSTURanker

CONFIG_FILE = "model.json"
WEIGHTS_FILE = "weights.pt"


def is_model_dir(path: str | Path) -> bool:
    return Path(path).is_dir()


def read_config(directory: str | Path) -> ModelConfig:
    """The config of a model directory; ValueError names the file and the field that does not fit."""
    path = Path(directory) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{directory}: no {CONFIG_FILE} (a model directory holds {CONFIG_FILE} and {WEIGHTS_FILE})"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    return ModelConfig.from_json(data, str(path))


def save_model_dir(directory: str | Path, config: ModelConfig, state: dict[str, Tensor]) -> Path:
    """Writes a model directory (checked by loading it back: a directory that would not load is not left)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(config.dumps())
    torch.save(
        {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}, out / WEIGHTS_FILE
    )
    try:
        load_model_dir(out)
    except Exception:
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            (out / name).unlink(missing_ok=True)
        raise
    return out


def load_model_dir(directory: str | Path) -> HSTURanker:
    """The model of a model directory, every tensor checked (see the module docstring)."""
    config = read_config(directory)
    path = Path(directory) / WEIGHTS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{directory}: no {WEIGHTS_FILE}") from None
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # a corrupt or unsafe file: never half-loaded
        raise ValueError(f"{path}: not a weights_only state_dict: {exc}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state_dict (a dict of tensors)")
    model = HSTURanker(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: missing key(s) {missing or '-'}; unexpected key(s) {unexpected or '-'}")
    for name, tensor in state.items():
        want = expected[name]
        if not isinstance(tensor, Tensor) or tensor.shape != want.shape or tensor.dtype != want.dtype:
            got = (
                f"{list(tensor.shape)} {tensor.dtype}"
                if isinstance(tensor, Tensor)
                else type(tensor).__name__
            )
            raise ValueError(f"{path}: key {name!r} is {got}, expected {list(want.shape)} {want.dtype}")
    if config.item_ids == "keys":
        keys = state["item_index.keys"]
        if len(keys) > 1 and not bool((keys[1:] > keys[:-1]).all()):
            raise ValueError(f"{path}: key 'item_index.keys' must be sorted and unique")
    model.load_state_dict(state, strict=True)
    digest = hashlib.sha256(config.dumps().encode() + data).hexdigest()[:12]
    model.version = f"{config.version}-{digest}"
    return model
