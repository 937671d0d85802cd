"""The one exactness check of the suite: scores equal a reference within float32 rounding.

Both sides become float32 tensors before `torch.testing.assert_close` compares them with its float32
defaults (rtol 1.3e-6, atol 1e-5). Python float lists would be compared as float64 (rtol = atol = 1e-7),
tighter than the fp32 arithmetic both paths run, so two exact paths whose kernels merely sum in another
order (the cached rank against one pass over the whole sequence, with several intra-op threads) would
fail at random.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

Scores = Iterable[float] | torch.Tensor


def as_scores(values: Scores) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().to(device="cpu", dtype=torch.float32)
    return torch.tensor(list(values), dtype=torch.float32)


def assert_scores_equal(actual: Scores, expected: Scores) -> None:
    torch.testing.assert_close(as_scores(actual), as_scores(expected))
