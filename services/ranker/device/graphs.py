"""CUDA graphs of the cached rank (`--cuda-graphs`, off by default).

A cached rank is a few hundred small kernels (five layers of projections, norms and two attention blocks):
at batch 1 on a GPU their launches, from Python, take longer than their work. `RankGraphs` captures
`HSTURanker.score_padded` once per shape bucket and replays it, so a rank costs a handful of copies into the
graph's inputs and one launch.

A bucket is (users B, prefix length bucket, short-term slots, candidate slots): the prefix length rounds up
to the next of `length_buckets`, short-term events and candidates to the next power of two (at least 8 and
16). Padding is exact: each user's prefix is copied to the start of its row of the graph's KV input and the
rest of the row is zeroed (a zero key adds nothing, and no previous user's KV survives in it), and padded
slots are masked out of every real token's view. A rank whose prefix is longer than the longest bucket, or
that finds `max_graphs` buckets captured already and none of its own, is not graphed (the caller runs the
eager path); past `max_graphs` the least recently used graph is dropped.

A capture happens on a bucket's first rank, on the rank stream's device thread (it synchronises the device
once: a one-off cost per bucket); errors of other threads are not captured (`thread_local`). All graphs
share one memory pool: each replay's scores are copied to the host before `scores` returns, so no replay
can overwrite another's outputs while they are still needed.

Made for CUDA. On any other device (`capture=False`, the tests' CPU path) the same padded inputs run
through `score_padded` directly, so the packing is tested without a GPU.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from services.ranker.device.accelerator import Accelerator
from services.ranker.model.hstu import CachedRank, HSTURanker

MIN_SHORT_SLOTS = 8
MIN_CANDIDATE_SLOTS = 16
WARMUP_RUNS = 2  # eager runs on a side stream before capture, as torch.cuda.graph asks


def _power_of_two(n: int, floor: int) -> int:
    return max(floor, 1 << (n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class Bucket:
    users: int
    length: int
    short: int  # short-term slots (0 when no user of the batch has short-term events)
    candidates: int

    @property
    def tokens(self) -> int:
        return self.short + self.candidates


class _Graph:
    """One bucket's static inputs and output, and its captured graph (None on CPU)."""

    def __init__(self, model: HSTURanker, bucket: Bucket, pinned: bool) -> None:
        preset, device = model.preset, model.device
        shape = (preset.num_layers, 2, bucket.users, preset.num_heads, bucket.length, preset.head_dim)
        self.kv = torch.zeros(shape, dtype=preset.dtype, device=device)
        self.tokens = torch.zeros((3, bucket.users, bucket.tokens), dtype=torch.int64, device=device)
        n = bucket.tokens
        self.mask = torch.zeros((bucket.users, 1, n, n), dtype=torch.bool, device=device)
        # Host staging of the small inputs: one copy each per rank, asynchronous from pinned memory.
        self.host_tokens = torch.zeros(self.tokens.shape, dtype=torch.int64, pin_memory=pinned)
        self.host_mask = torch.zeros(self.mask.shape, dtype=torch.bool, pin_memory=pinned)
        self.scores: Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None


class RankGraphs:
    """Cached ranks through captured graphs, one per `Bucket`; see the module docstring."""

    def __init__(
        self,
        model: HSTURanker,
        accelerator: Accelerator,
        length_buckets: Sequence[int],
        max_graphs: int,
        capture: bool | None = None,
    ) -> None:
        if not length_buckets or any(b < 1 for b in length_buckets) or max_graphs < 1:
            raise ValueError("RankGraphs needs positive length buckets and max_graphs")
        self.model = model
        self.accelerator = accelerator
        self.length_buckets = sorted(set(length_buckets))
        self.max_graphs = max_graphs
        self.capture = accelerator.device.type == "cuda" if capture is None else capture
        if self.capture and accelerator.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {accelerator.device}")
        self._graphs: collections.OrderedDict[Bucket, _Graph] = collections.OrderedDict()
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.captures = 0  # graphs captured so far (a dropped bucket captured again counts again)
        self.replays = 0

    def bucket(self, requests: Sequence[CachedRank]) -> Bucket | None:
        """The bucket these ranks replay in, or None when the longest prefix exceeds every length bucket."""
        longest = max(request.prefix.length for request in requests)
        length = next((b for b in self.length_buckets if b >= longest), None)
        if length is None:
            return None
        short = max(request.short_items.shape[0] for request in requests) * self.model.tokens_per_event
        candidates = max(request.candidates.shape[0] for request in requests)
        return Bucket(
            users=len(requests),
            length=length,
            short=_power_of_two(short, MIN_SHORT_SLOTS) if short else 0,
            candidates=_power_of_two(candidates, MIN_CANDIDATE_SLOTS),
        )

    def scores(self, requests: Sequence[CachedRank]) -> list[Tensor] | None:
        """Each user's scores [C_i] (float32, on the host), or None when these ranks are not graphed (the
        caller then runs the eager path). Each rank's prefix is on the model's device; its short-term events
        and candidates are best on the host (they are staged there). Runs on the current stream."""
        if not requests:
            return []
        bucket = self.bucket(requests)
        if bucket is None:
            return None
        graph = self._graph(bucket)
        if graph is None:
            return None
        self._fill(graph, bucket, requests)
        if graph.graph is not None:
            graph.graph.replay()
        else:
            graph.scores = self._run(graph, bucket)
        self.replays += 1
        flat = graph.scores.cpu()  # waits for the rank stream; the graph's output may be reused after this
        return [flat[row, : request.candidates.shape[0]] for row, request in enumerate(requests)]

    # ---- internals ----

    def _graph(self, bucket: Bucket) -> _Graph | None:
        graph = self._graphs.get(bucket)
        if graph is not None:
            self._graphs.move_to_end(bucket)
            return graph
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)
        graph = _Graph(self.model, bucket, pinned=self.capture)
        if self.capture:
            self._capture(graph, bucket)
        self._graphs[bucket] = graph
        self.captures += 1
        return graph

    def _run(self, graph: _Graph, bucket: Bucket) -> Tensor:
        return self.model.score_padded(graph.kv, graph.tokens, graph.mask, bucket.short)

    def _capture(self, graph: _Graph, bucket: Bucket) -> None:
        # The inputs are zeros (every token masked to itself): warm-up and capture read valid memory, and
        # what they compute is never returned.
        graph.mask.copy_(torch.eye(bucket.tokens, dtype=torch.bool).expand_as(graph.host_mask))
        side = torch.cuda.Stream(self.accelerator.device)
        side.wait_stream(torch.cuda.current_stream(self.accelerator.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._run(graph, bucket)
        torch.cuda.current_stream(self.accelerator.device).wait_stream(side)
        graph.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph.graph, pool=self._pool, capture_error_mode="thread_local"):
            graph.scores = self._run(graph, bucket)

    def _fill(self, graph: _Graph, bucket: Bucket, requests: Sequence[CachedRank]) -> None:
        """Copies the ranks into the graph's inputs, on the current stream."""
        tokens, mask = graph.host_tokens, graph.host_mask
        tokens.zero_()
        mask.zero_()
        short_slots = bucket.short
        for row, request in enumerate(requests):
            prefix = request.prefix
            length = prefix.length
            self.model.check_request(1, request.short_items[None], request.candidates[None], length)
            # The model's tokens (item rows, action rows, positions): the layout is the model's business.
            short, cands = self.model.rank_tokens(
                length, request.short_items[None], request.short_actions[None], request.candidates[None]
            )
            num_short, num_candidates = short.items.shape[1], cands.items.shape[1]
            tokens[0, row, :num_short] = short.items[0]
            tokens[1, row, :num_short] = short.actions[0]
            tokens[2, row, :num_short] = short.positions
            candidates = slice(short_slots, short_slots + num_candidates)
            tokens[0, row, candidates] = cands.items[0]
            tokens[1, row, candidates] = cands.actions[0]
            tokens[2, row, candidates] = cands.positions
            # M: short-term tokens causal; candidates see every short-term token and themselves; every
            # slot sees itself (a padded slot nothing else), so no row of the attention is empty.
            mask[row, 0].fill_diagonal_(True)
            mask[row, 0, :num_short, :num_short] = torch.ones(num_short, num_short, dtype=torch.bool).tril()
            mask[row, 0, candidates, :num_short] = True
            kv = prefix.wait().buffer.to(self.model.device, self.model.preset.dtype)
            graph.kv[:, :, row, :, :length].copy_(kv[:, :, 0])
            graph.kv[:, :, row, :, length:].zero_()
        graph.tokens.copy_(tokens, non_blocking=self.capture)
        graph.mask.copy_(mask, non_blocking=self.capture)
