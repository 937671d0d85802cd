"""Checkpoints load tensors only (`torch.load(weights_only=True)`): a checkpoint that carries a pickled
object is refused before that object can run, in-process and by a ranker process, which then never serves.
A checkpoint of tensors loads, and names the model version after its digest.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import pytest
import torch

from services.common.contract import RANKER_SERVICE
from services.launcher.procs import Processes
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset

PRESET = get_preset("cpu-tiny")


class Payload:
    """Unpickling this runs a shell command: what a hostile checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def hostile_checkpoint(folder: Path) -> tuple[Path, Path]:
    """A state_dict with every tensor the model needs, plus one pickled Payload; and the Payload's marker."""
    marker = folder / "payload-ran"
    state = dict(HSTURanker(PRESET).state_dict())
    state["extra"] = Payload(marker)
    path = folder / "hostile.pt"
    torch.save(state, path)
    return path, marker


def test_a_checkpoint_with_a_pickled_object_is_refused_before_the_object_runs(tmp_path: Path) -> None:
    path, marker = hostile_checkpoint(tmp_path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        HSTURanker.from_checkpoint(PRESET, path)
    assert not marker.exists()
    # The same file read without the restriction would have run it: the test's payload is live.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_ranker_given_a_hostile_checkpoint_exits_without_serving(tmp_path: Path) -> None:
    path, marker = hostile_checkpoint(tmp_path)
    args = ["--instance-name", "ranker-0", "--model-preset", "cpu-tiny", "--checkpoint", str(path)]
    with Processes(log_dir=tmp_path) as procs:
        ranker = procs.start("ranker-0", "services.ranker", RANKER_SERVICE, args)
        assert ranker.popen.wait(120) != 0
    assert not marker.exists()
    assert "Weights only load failed" in (tmp_path / "ranker-0.log").read_text()


def test_a_checkpoint_of_tensors_loads_and_versions_the_model(tmp_path: Path) -> None:
    seeded = HSTURanker(PRESET)
    state = {name: tensor * 0.5 for name, tensor in seeded.state_dict().items()}
    path = tmp_path / "weights.pt"
    torch.save(state, path)
    model = HSTURanker.from_checkpoint(PRESET, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    assert model.version.endswith(digest) and model.version != seeded.version
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, state[name])
