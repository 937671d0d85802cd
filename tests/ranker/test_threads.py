"""A ranker's torch threads: the process's CPU budget by default, the flag when given; one metric series
says how many and what chose them."""

from __future__ import annotations

import torch

from services.common.cpus import cpu_budget
from services.ranker.app import set_torch_threads
from tests.support.metrics import metric


def test_torch_threads_fit_the_process_unless_the_flag_says_otherwise():
    before = torch.get_num_threads()
    budget = cpu_budget()
    try:
        assert set_torch_threads(0) == budget.cpus == torch.get_num_threads()
        assert metric("relaygr_torch_threads", source=budget.source) == budget.cpus
        assert set_torch_threads(3) == 3 == torch.get_num_threads()
        assert metric("relaygr_torch_threads", source="flag") == 3
        assert metric("relaygr_torch_threads", source=budget.source) == 0  # one series: the one in force
    finally:
        torch.set_num_threads(before)
