"""Device selection: `--device auto` picks an Ascend NPU (torch_npu, imported only when installed), then
CUDA, then CPU; and the device's backend module (`torch.cuda`, `torch.npu`) where there is one."""

from __future__ import annotations

import importlib

import torch


def _npu_available() -> bool:
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return False
    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def select_device(spec: str) -> torch.device:
    """The torch device for `--device`: npu, cuda, cpu (optionally with an index), or auto."""
    if spec == "auto":
        if _npu_available():
            return torch.device("npu")
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if spec.startswith("npu") and not _npu_available():
        raise ValueError("--device npu needs torch_npu and an Ascend NPU")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA build of torch and a GPU")
    return torch.device(spec)


def backend(device: torch.device):
    return getattr(torch, device.type) if device.type in ("cuda", "npu") else None


def synchronize(device: torch.device) -> None:
    module = backend(device)
    if module is not None:
        module.synchronize(device)
