"""Where a benchmark ran, recorded beside what it measured, written once for every entry point: the commit
(`commit`, `git_commit`; what two commits differ in: `changed_between`), the machine (`machine`,
`load_average`) and the packages (`versions`)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess

from bench.lib import codec
from bench.lib.gpu_monitor import gpu_info
from bench.lib.schema import Machine, Versions
from services.launcher.procs import REPO_ROOT

PACKAGES = ("torch", "numpy", "grpcio", "protobuf", "matplotlib")


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)


def commit() -> tuple[str, bool]:
    """The checkout's short commit and whether tracked files differ from it."""
    dirty = _git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return _git("rev-parse", "--short", "HEAD").stdout.strip(), bool(dirty)


def changed_between(first: str, second: str) -> list[str] | None:
    """The paths (from the repository's root) that differ between two commits; None when this checkout
    does not know one of them."""
    answer = _git("diff", "--name-only", first, second)
    return answer.stdout.split() if answer.returncode == 0 else None


def git_commit() -> str:
    """The short commit, `-dirty` appended when tracked files differ from it."""
    short, dirty = commit()
    return short + ("-dirty" if dirty else "")


def load_average() -> list[float]:
    """The machine's 1, 5 and 15-minute load averages, to two decimals."""
    return [round(load, 2) for load in os.getloadavg()]


def _first_line_with(path: str, prefix: str) -> str:
    try:
        with open(path) as lines:
            return next(
                (line.split(":", 1)[1].strip() for line in lines if line.startswith(prefix)), "unknown"
            )
    except OSError:
        return "unknown"


def machine() -> Machine:
    """This machine: cores, CPU (and its vector instructions), memory, platform, Python, its load now and its
    GPU (None without one)."""
    mem_kib = _first_line_with("/proc/meminfo", "MemTotal").split()[0]
    return Machine(
        cores=os.cpu_count(),
        cpu_model=_first_line_with("/proc/cpuinfo", "model name"),
        memory_gib=round(int(mem_kib) / 2**20, 1) if mem_kib.isdigit() else None,
        platform=platform.platform(),
        python=platform.python_version(),
        load_average_at_start=list(os.getloadavg()),
        gpu=gpu_info(),
        cpu_capability=cpu_capability(),
    )


def cpu_capability() -> str | None:
    """The widest vector instructions torch's CPU kernels dispatch to on this machine (AVX2, AVX512, ...)."""
    import torch

    try:
        return torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # a torch without it
        return None


def versions() -> Versions:
    """The packages' versions, torch's CUDA and the commit."""
    import torch

    found = {name: importlib.metadata.version(name) for name in PACKAGES}
    found["torch_cuda"] = torch.version.cuda or "none"
    return Versions(**found, git_commit=git_commit())


def provenance() -> dict[str, object]:
    """The commit, machine and packages as an envelope's header holds them (`bench.lib.envelope.write`)."""
    return {
        "commit": git_commit(),
        "machine": codec.to_json(machine()),
        "versions": codec.to_json(versions()),
    }
