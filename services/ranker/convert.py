"""`python -m services.ranker.convert --source PATH --source-config CFG.json --model-dir DIR`.

Converts a checkpoint trained elsewhere (`--source-format`: NVIDIA recsys-examples' HSTU ranking model, read
by `model/recsys_examples.py`, whose docstring says what it reads and how it maps onto our model family)
into a model directory (`model/store.py`) that `python -m services.ranker --checkpoint DIR` serves, with
relay. Its settings (`ConvertConfig`) are flags with `RELAYGR_…` environment twins like every service's
(docs/configuration.md lists them).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence

from services.common.config import check, flag_name, load, setting
from services.ranker.model.recsys_examples import CONFIG_FIELDS, convert_recsys_examples, read_config
from services.ranker.model.store import save_model_dir

SOURCE_FORMATS = ("recsys-examples",)


@dataclasses.dataclass(frozen=True)
class ConvertConfig:
    """What `python -m services.ranker.convert` converts, from where, to where."""

    source_format: str = setting(
        "recsys-examples",
        "the framework the checkpoint was trained with (NVIDIA recsys-examples' HSTU ranking model)",
        choices=SOURCE_FORMATS,
    )
    source: str = setting(
        "", "the checkpoint to convert: the directory their training saved, or its torch_module/model.0.pth"
    )
    source_config: str = setting(
        "",
        "JSON file of what the checkpoint does not hold: "
        + "; ".join(f"{name}: {meaning}" for name, meaning in CONFIG_FIELDS.items()),
    )
    model_dir: str = setting(
        "", "the model directory to write (model.json, weights.pt), which a ranker's --checkpoint serves"
    )

    def validate(self) -> None:
        check(self)
        for name in ("source", "source_config", "model_dir"):
            if not getattr(self, name):
                raise ValueError(f"{flag_name(name)} is required")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    config = load(
        ConvertConfig,
        argv,
        environ,
        prog="python -m services.ranker.convert",
        description="Convert a checkpoint trained elsewhere into a model directory for --checkpoint DIR.",
    )
    try:
        model, state = convert_recsys_examples(config.source, read_config(config.source_config))
        out = save_model_dir(config.model_dir, model, state)
    except ValueError as exc:  # ConvertError, NotClosedError, a store check
        print(f"convert: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {out} (model {model.name}, {model.num_layers} layers, D {model.embed_dim}, "
        f"version {model.version})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
