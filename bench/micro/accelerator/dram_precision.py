"""What each `--dram-precision` of the ranker does to its scores, in process on CPU (`--measures
dram-precision`), whatever `--device`.

For each CPU preset (seeded weights) and an imported recsys-examples HSTU checkpoint (a random one at
gpu-dlrmv3's shape, written by `bench.lib.recsys_checkpoints`, read by
`services.ranker.model.recsys_examples`) it ranks `--dram-users` users of each of `--dram-lengths`: by the
model's full fp32 pass (the reference), and from the user's prefix demoted to DRAM and reloaded by the
ranker's `TierCopier` at each precision. It prints the bytes a DRAM copy takes against fp32's and the
largest absolute and relative score error.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.lib.recsys_checkpoints import cfg_for, write_checkpoint
from bench.micro.accelerator.config import AcceleratorBenchConfig
from services.common.config import listed
from services.ranker.device.accelerator import Accelerator
from services.ranker.device.copier import TierCopier
from services.ranker.model import recsys_examples
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.kv_precision import DRAM_PRECISIONS, dram_dtype
from services.ranker.model.presets import PRESETS
from services.ranker.model.store import load_model_dir, save_model_dir

CPU = torch.device("cpu")


@dataclasses.dataclass
class Row:
    model: str
    precision: str
    bytes_vs_fp32: float
    max_abs: float
    max_rel: float


def recsys_examples_model(directory: Path, seed: int) -> tuple[str, HSTURanker, int]:
    """A random recsys-examples checkpoint at gpu-dlrmv3's shape, imported: its name, model and item count."""
    cfg = cfg_for(heads=4, scaling_seqlen=8192, act="gelu", items=300, actions=8)
    write_checkpoint(directory / "ckpt", cfg, dim=512, head_dim=128, layers=5, positions=40,
                     head=(256, 64, 3), seed=seed)  # fmt: skip
    (directory / "cfg.json").write_text(json.dumps(cfg))
    config, state = recsys_examples.convert_recsys_examples(
        directory / "ckpt", recsys_examples.read_config(directory / "cfg.json")
    )
    model = load_model_dir(save_model_dir(directory / "model", config, state))
    return "recsys-examples (D 512, 4x128, 5 layers)", model.eval(), cfg["vocab"]["item"]


def models(directory: Path, seed: int) -> list[tuple[str, HSTURanker, int | None]]:
    """Every model measured: (name, model, item ids below this, or None for any id)."""
    found: list[tuple[str, HSTURanker, int | None]] = []
    for name, preset in PRESETS.items():
        if preset.dtype == torch.float32:  # the CPU presets
            torch.manual_seed(seed)
            found.append((name, HSTURanker(preset).eval(), None))
    found.append(recsys_examples_model(directory, seed))
    return found


def measure(name: str, model: HSTURanker, items: int | None, config: AcceleratorBenchConfig) -> list[Row]:
    preset = model.preset
    generator = torch.Generator().manual_seed(config.dram_seed)

    def events(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        high = items if items is not None else 2**40
        ids = torch.randint(0, high, (1, n), generator=generator)
        return ids, torch.randint(0, preset.num_action_types, (1, n), generator=generator)

    copiers = {
        p: TierCopier(Accelerator(CPU), preset.dtype, dram_dtype(p, preset.dtype)) for p in DRAM_PRECISIONS
    }
    errors, nbytes = {p: (0.0, 0.0) for p in DRAM_PRECISIONS}, dict.fromkeys(DRAM_PRECISIONS, 0)
    for length in listed(config, "dram_lengths"):
        for _ in range(config.dram_users):
            long_items, long_actions = events(length)
            short_items, short_actions = events(config.dram_short_term)
            candidates = events(config.dram_candidates)[0]
            logits = model.full_forward(long_items, long_actions, short_items, short_actions, candidates)
            reference = torch.sigmoid(logits[..., preset.score_task])
            prefix = model.pre_infer(long_items, long_actions)
            for precision, copier in copiers.items():
                dram = copier.to_dram(prefix)
                nbytes[precision] += dram.nbytes()
                scores = model.score(copier.to_hbm(dram), short_items, short_actions, candidates)
                error = (scores - reference).abs()
                worst_abs, worst_rel = errors[precision]
                errors[precision] = (
                    max(worst_abs, error.max().item()),
                    max(worst_rel, (error / reference.abs()).max().item()),
                )
    fp32 = nbytes["exact"] * 4 // preset.dtype.itemsize
    return [Row(name, p, nbytes[p] / fp32, *errors[p]) for p in DRAM_PRECISIONS]


def report(rows: Sequence[Row], config: AcceleratorBenchConfig) -> str:
    return "\n".join([
        f"{config.dram_users} users at each of {config.dram_lengths} events, {config.dram_short_term} "
        f"short-term events, {config.dram_candidates} candidates; scores against the full fp32 pass",
        "",
        "| model | --dram-precision | DRAM bytes vs fp32 | max abs error | max relative error |",
        "|---|---|---|---|---|",
        *(f"| {r.model} | {r.precision} | {r.bytes_vs_fp32:.4f} | {r.max_abs:.2e} | {r.max_rel:.2e} |"
          for r in rows),
    ])  # fmt: skip


def run(config: AcceleratorBenchConfig) -> str:
    """Every model's rows at every precision, as `report`'s table, measured on one torch thread (the figures
    are errors, not times); the process's thread count is restored after, for a device path measured next."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as directory:
            found = models(Path(directory), config.dram_seed)
            rows = [row for name, model, items in found for row in measure(name, model, items, config)]
    finally:
        torch.set_num_threads(threads)
    return report(rows, config)
