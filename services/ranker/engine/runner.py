"""Model calls as device-thread jobs: turns `Events` into tensors on the device and runs the model.

`ModelRunner` is the only object that touches the model. Its async-facing methods return futures
resolved by the `Scheduler` thread, which runs the work with the given priority; the `*_sync`
methods are the work itself. A prefix is computed in chunks, and its job lets every more urgent queued job
run between two chunks through the `Yield` the scheduler hands it (the runner only calls it). Cached ranks
queued together run as one batch (`rank_batch_sync`).

On an accelerator, kernels launch asynchronously, so "a Rank waits at most one chunk" needs more than the
queue order: Ranks (and a miss's own prefix) run on the high-priority rank stream, background
pre-inference on the low-priority pre-infer stream, and the device thread keeps at most `inflight_chunks`
pre-infer chunks queued on the device (it waits on the oldest chunk's event, never on the whole device).
A prefix is handed over by an event recorded where it was produced: the stream that consumes it waits for
that event, the host does not. Only a Rank's scores come back to the host, waiting for the rank stream.
On CPU the same calls run synchronously (`Accelerator`'s stand-ins).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import torch

from services.ranker.device.accelerator import Accelerator, InflightWindow
from services.ranker.device.graphs import RankGraphs
from services.ranker.engine.scheduler import Batch, Op, Priority, Scheduler
from services.ranker.model.events import Events
from services.ranker.model.hstu import CachedRank, HSTURanker
from services.ranker.model.prefix_kv import PrefixKV

RankItem = tuple[PrefixKV, Events, Sequence[int]]


def _no_yield() -> None:
    """Between chunks of a build run outside a yielding job (inline, or in a job that lets nothing by)."""


class ModelRunner:
    def __init__(
        self,
        model: HSTURanker,
        worker: Scheduler,
        chunk_tokens: int,
        candidate_microbatch: int | None,
        model_version: str,
        accelerator: Accelerator | None = None,
        inflight_chunks: int = 2,
        rank_batch_max: int = 8,
        graphs: RankGraphs | None = None,
    ) -> None:
        """`graphs` (None: eager only) replays cached ranks through CUDA graphs where a bucket fits."""
        if inflight_chunks < 1 or rank_batch_max < 1:
            raise ValueError("inflight_chunks and rank_batch_max must be positive")
        self.model = model
        self.worker = worker
        self.device = model.device
        self.accelerator = accelerator or Accelerator(model.device)
        self.chunk_tokens = chunk_tokens
        self.candidate_microbatch = candidate_microbatch
        self.model_version = model_version
        self.kv_bytes_per_token = model.preset.kv_bytes_per_token
        self.inflight_chunks = inflight_chunks
        if graphs is not None and candidate_microbatch:
            raise ValueError("CUDA graphs rank all candidates at once: they exclude candidate microbatching")
        self.graphs = graphs
        # Candidate microbatching bounds one rank's memory; batching users would undo it.
        self._rank_batch = Batch(self.rank_batch_sync, 1 if candidate_microbatch else rank_batch_max)

    def _tensor(self, values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).reshape(1, -1).to(self.device)

    # ---- the work, on the device thread ----

    def build_sync(
        self,
        events: Events,
        background: bool,
        base: PrefixKV | None = None,
        *,
        between_chunks: Callable[[], None] = _no_yield,
    ) -> PrefixKV:
        """The prefix KV of `events` appended to `base` (None: from the start), always in chunks: besides
        bounding a rank's wait, chunks keep the attention blocks small, which is faster on long
        prefixes. `between_chunks` is called between two chunks: in a device job, the scheduler's `Yield`,
        where every queued job more urgent than this one runs. A `background` build (pre-inference) runs on
        the pre-infer stream, any other on the rank stream. The result carries the event its consumers wait
        for."""
        accelerator = self.accelerator
        stream = accelerator.pre_infer_stream if background else accelerator.rank_stream
        window = InflightWindow(self.inflight_chunks)
        with accelerator.on(stream):
            builder = self.model.prefix_builder(
                self._tensor(events.item_ids), self._tensor(events.action_types), self.chunk_tokens, base
            )
            builder.step()
            window.push(accelerator.record())
            while not builder.done:
                between_chunks()
                builder.step()
                window.push(accelerator.record())
            kv = builder.result()
            if base is not None:
                accelerator.used_by(base.buffer, stream)
            done = accelerator.record()
        return PrefixKV(kv.buffer, ready=[done] * kv.num_layers)

    def _graphed(self, items: list[RankItem]) -> list[list[float]] | None:
        """Scores of `items` through a CUDA graph, or None where none applies (the caller runs eager)."""
        if self.graphs is None:
            return None
        host = lambda values: torch.as_tensor(values, dtype=torch.int64)  # noqa: E731
        requests = [
            CachedRank(prefix, host(short.item_ids), host(short.action_types), host(candidates))
            for prefix, short, candidates in items
        ]
        scores = self.graphs.scores(requests)
        if scores is None:
            return None
        for prefix, _, _ in items:
            self.accelerator.used_by(prefix.buffer, self.accelerator.rank_stream)
        return [part.tolist() for part in scores]

    def rank_sync(self, prefix: PrefixKV, short: Events, candidates: Sequence[int]) -> list[float]:
        """Scores of one user's candidates against a prefix, on the rank stream."""
        accelerator = self.accelerator
        with accelerator.on(accelerator.rank_stream):
            graphed = self._graphed([(prefix, short, candidates)])
            if graphed is not None:
                return graphed[0]
            scores = self.model.score(
                prefix,
                self._tensor(short.item_ids),
                self._tensor(short.action_types),
                self._tensor(candidates),
                self.candidate_microbatch,
            )
            accelerator.used_by(prefix.buffer, accelerator.rank_stream)
            return scores[0].float().cpu().tolist()

    def rank_batch_sync(self, items: list[RankItem]) -> list[list[float]]:
        """Scores of several users' cached ranks in one pass on the rank stream, one list per user: equal
        to `rank_sync` one user at a time (to float rounding)."""
        if len(items) == 1:
            return [self.rank_sync(*items[0])]
        accelerator = self.accelerator
        with accelerator.on(accelerator.rank_stream):
            graphed = self._graphed(items)
            if graphed is not None:
                return graphed
            requests = [
                CachedRank(
                    prefix,
                    self._tensor(short.item_ids)[0],
                    self._tensor(short.action_types)[0],
                    self._tensor(candidates)[0],
                )
                for prefix, short, candidates in items
            ]
            scores = self.model.score_batch(requests)
            for prefix, _, _ in items:
                accelerator.used_by(prefix.buffer, accelerator.rank_stream)
            flat = torch.cat(scores).float().cpu()  # one copy back for the whole batch
        return [part.tolist() for part in flat.split([len(c) for _, _, c in items])]

    def uncached_sync(
        self,
        long: Events,
        short: Events,
        candidates: Sequence[int],
        *,
        between_chunks: Callable[[], None] = _no_yield,
    ) -> list[float]:
        """Ranking without relay: the prefix computed in chunks (`between_chunks` called between two, as
        in `build_sync`), ranked against, then dropped. Equal to `full_sync` (exact reuse) and several times
        faster on long sequences, where one pass over the whole sequence builds L x L attention blocks."""
        prefix = self.build_sync(long, background=False, between_chunks=between_chunks)
        return self.rank_sync(prefix, short, candidates)

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
        """The PrefixKV of `events`, computed at `priority` (PRE_INFER: in the background, on the pre-infer
        stream); more urgent work runs between its chunks."""
        background = priority is Priority.PRE_INFER
        job = lambda yield_: self.build_sync(events, background, between_chunks=yield_)  # noqa: E731
        return self.worker.submit_yielding(job, priority, Op.PRE_INFER, deadline, work=len(events))

    def extend(
        self, base: PrefixKV, appended: Events, priority: Priority, deadline: float | None = None
    ) -> asyncio.Future[PrefixKV]:
        """`base` extended with the events appended since it was computed."""
        background = priority is Priority.PRE_INFER
        job = lambda yield_: self.build_sync(appended, background, base, between_chunks=yield_)  # noqa: E731
        return self.worker.submit_yielding(job, priority, Op.EXTEND, deadline, work=len(appended))

    def rank(
        self, prefix: PrefixKV, short: Events, candidates: Sequence[int], deadline: float | None
    ) -> asyncio.Future[list[float]]:
        """Scores of `candidates` (request order) against a ready prefix; ranks queued together run as one
        batch."""
        item = (prefix, short, candidates)
        return self.worker.submit_batched(
            item, self._rank_batch, Priority.RANK, Op.RANK, deadline, work=prefix.length
        )

    def uncached(
        self, long: Events, short: Events, candidates: Sequence[int], deadline: float | None
    ) -> asyncio.Future[list[float]]:
        """Scores computed without keeping a prefix: the path when no prefix can be held."""
        job = lambda yield_: self.uncached_sync(long, short, candidates, between_chunks=yield_)  # noqa: E731
        return self.worker.submit_yielding(job, Priority.AWAITED, Op.UNCACHED, deadline, work=len(long))
