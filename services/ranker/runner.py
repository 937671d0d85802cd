"""Model calls as device-thread jobs: turns `Events` into tensors on the device and runs the model.

`ModelRunner` is the only object that touches the model. Its async-facing methods return futures
resolved by the `Scheduler` thread, which runs the work with the given priority; the `*_sync`
methods are the work itself. Background pre-inference runs in chunks and lets every queued rank run
between two chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

from services.ranker.device import synchronize
from services.ranker.events import Events
from services.ranker.model import HSTURanker, PrefixKV
from services.ranker.scheduler import Op, Priority, Scheduler


class ModelRunner:
    def __init__(
        self,
        model: HSTURanker,
        worker: Scheduler,
        chunk_tokens: int,
        candidate_microbatch: int | None,
        model_version: str,
    ) -> None:
        self.model = model
        self.worker = worker
        self.device = model.device
        self.chunk_tokens = chunk_tokens
        self.candidate_microbatch = candidate_microbatch
        self.model_version = model_version
        self.kv_bytes_per_token = model.preset.kv_bytes_per_token

    def _tensor(self, values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).reshape(1, -1).to(self.device)

    # ---- the work, on the device thread ----

    def build_sync(self, events: Events, yield_to_ranks: bool, base: PrefixKV | None = None) -> PrefixKV:
        """The prefix KV of `events` appended to `base` (None: from the start), always in chunks: besides
        bounding a rank's wait, chunks keep the attention blocks small, which is faster on long
        prefixes. When `yield_to_ranks`, every queued rank runs between two chunks."""
        builder = self.model.prefix_builder(
            self._tensor(events.item_ids), self._tensor(events.action_types), self.chunk_tokens, past=base
        )
        builder.step()
        while not builder.done:
            if yield_to_ranks:
                self.worker.run_more_urgent()
            builder.step()
        kv = builder.result()
        synchronize(self.device)
        return kv

    def rank_sync(self, prefix: PrefixKV, short: Events, candidates: Sequence[int]) -> list[float]:
        scores = self.model.score(
            prefix,
            self._tensor(short.item_ids),
            self._tensor(short.action_types),
            self._tensor(candidates),
            self.candidate_microbatch,
        )
        return scores[0].float().cpu().tolist()

    def uncached_sync(self, long: Events, short: Events, candidates: Sequence[int]) -> list[float]:
        """Ranking without relay: the prefix computed in chunks, ranked against, then dropped. Equal to
        `full_sync` (exact reuse) and several times faster on long sequences, where one pass over the
        whole sequence builds L x L attention blocks."""
        return self.rank_sync(self.build_sync(long, yield_to_ranks=False), short, candidates)

    def full_sync(self, long: Events, short: Events, candidates: Sequence[int]) -> list[float]:
        """The model's reference: one attention pass per layer over the whole sequence."""
        logits = self.model.full_forward(
            self._tensor(long.item_ids),
            self._tensor(long.action_types),
            self._tensor(short.item_ids),
            self._tensor(short.action_types),
            self._tensor(candidates),
        )
        return torch.sigmoid(logits[0, :, 0]).float().cpu().tolist()

    # ---- submitted from the event loop ----

    def pre_infer(
        self, events: Events, priority: Priority, deadline: float | None = None
    ) -> asyncio.Future[PrefixKV]:
        """The PrefixKV of `events`; background (pre-infer priority) work yields to ranks between chunks."""
        background = priority is Priority.PRE_INFER
        job = lambda: self.build_sync(events, background)  # noqa: E731
        return self.worker.submit(job, priority, Op.PRE_INFER, deadline)

    def extend(
        self, base: PrefixKV, appended: Events, priority: Priority, deadline: float | None = None
    ) -> asyncio.Future[PrefixKV]:
        """`base` extended with the events appended since it was computed."""
        background = priority is Priority.PRE_INFER
        job = lambda: self.build_sync(appended, background, base)  # noqa: E731
        return self.worker.submit(job, priority, Op.EXTEND, deadline)

    def rank(
        self, prefix: PrefixKV, short: Events, candidates: Sequence[int], deadline: float | None
    ) -> asyncio.Future[list[float]]:
        """Scores of `candidates` (request order) against a ready prefix."""
        job = lambda: self.rank_sync(prefix, short, candidates)  # noqa: E731
        return self.worker.submit(job, Priority.RANK, Op.RANK, deadline)

    def uncached(
        self, long: Events, short: Events, candidates: Sequence[int], deadline: float | None
    ) -> asyncio.Future[list[float]]:
        """Scores computed without keeping a prefix: the path when no prefix can be held."""
        job = lambda: self.uncached_sync(long, short, candidates)  # noqa: E731
        return self.worker.submit(job, Priority.RANK, Op.UNCACHED, deadline)
