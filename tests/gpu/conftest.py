"""The accelerator checks run only where there is a CUDA GPU: every test in tests/gpu is skipped, with the
reason, on a machine without one (and by `make test` on CPU machines)."""

from __future__ import annotations

import pytest
import torch

REASON = "needs a CUDA GPU: run `make test-gpu` on a GPU machine"


def pytest_collection_modifyitems(config, items) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=REASON)
    for item in items:
        if item.path.parent.name == "gpu" and "tests" in item.path.parts:
            item.add_marker(skip)
