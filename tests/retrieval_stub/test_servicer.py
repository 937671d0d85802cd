"""The servicer's pure helpers: top-k order and cache-source labels."""

from __future__ import annotations

import numpy as np

from relaygr.v1 import common_pb2
from services.common.contract import cache_source_label
from services.retrieval_stub.dataplane import top_k_order


def test_top_k_order_is_best_first_and_keeps_candidate_order_on_ties():
    scores = np.array([0.1, 0.9, 0.5, 0.9, 0.7], dtype=np.float32)
    assert top_k_order(scores, 3).tolist() == [1, 3, 4]
    assert top_k_order(scores, 5).tolist() == [1, 3, 4, 2, 0]


def test_cache_source_labels_match_the_metric_label_values():
    labels = {
        common_pb2.CACHE_SOURCE_HBM: "hbm",
        common_pb2.CACHE_SOURCE_DRAM: "dram",
        common_pb2.CACHE_SOURCE_EXTENDED: "extended",
        common_pb2.CACHE_SOURCE_MISS: "miss",
    }
    assert {source: cache_source_label(source) for source in labels} == labels
