"""PreInfer + Rank pairs at rankers: their settings, the requests, and the one open-loop driver, `Driver`:
pairs one every 1/rate s whatever the answers (`open_loop`), each Rank a relay window after its PreInfer's
intended time, its latency read from then; `Via` says how the PreInfers travel (alone, in PreInferBatch
windows, or as Admits to a trigger)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

import grpc
import numpy as np

from relaygr.v1 import common_pb2, ranker_pb2, trigger_pb2
from services.common.config import setting
from services.common.contract import RANKER_SERVICE, TRIGGER_SERVICE

RPC_TIMEOUT_S = 30.0
HBM = common_pb2.CacheSource.Name(common_pb2.CACHE_SOURCE_HBM)
READY_MS = 1.0  # a Rank found its prefix ready when it waited less than this for it
LEAD_S = 0.05  # from the start of an open-loop run to its first send
# The most PreInfers a window holds: the trigger's default `--pre-infer-batch-max`.
BATCH_MAX = 32
# Distinct long-term histories a run of pairs draws from: each pair is a fresh user (the ranker keys its
# caches by user), and a few hundred histories keep the bytes from repeating without building thousands.
HISTORIES = 256
RANKER_CALLS = {
    "PreInfer": ranker_pb2.PreInferResponse,
    "PreInferBatch": ranker_pb2.PreInferBatchResponse,
    "Rank": ranker_pb2.RankResponse,
}


@dataclasses.dataclass(frozen=True)
class PairSettings:
    """The pairs' settings that `serving` and `shared-device` share."""

    short_term: int = setting(16, "short-term events of each Rank", above=0)
    relay_window_ms: float = setting(30.0, "from a PreInfer to its Rank (the relay window)", minimum=0)
    seed: int = setting(0, "seed of the users' histories and candidates", minimum=0)


def _sequence(length: int, rng: np.random.Generator) -> common_pb2.BehaviorSequence:
    start_ms = 1_700_000_000_000
    return common_pb2.BehaviorSequence(
        item_ids=rng.integers(0, 10**6, length).tolist(),
        action_types=rng.integers(0, 8, length).tolist(),
        timestamps_ms=range(start_ms, start_ms + length * 1000, 1000),
    )


@dataclasses.dataclass(frozen=True)
class Pair:
    pre_infer: bytes
    rank: bytes


def make_pairs(
    tag: str, count: int, length: int, short_term: int, candidates: int, instance: str, seed: int
) -> list[Pair]:
    """Serialized PreInfer and Rank requests of `count` fresh users (built before the clock starts), each
    Rank with the relay hint `instance`."""
    rng = np.random.default_rng(seed)
    histories = [_sequence(length, rng) for _ in range(min(count, HISTORIES))]
    pairs = []
    for i in range(count):
        user, long_term = f"{tag}-{i}", histories[i % len(histories)]
        pre = ranker_pb2.PreInferRequest(user_id=user, long_term=long_term)
        rank = ranker_pb2.RankRequest(
            user_id=user,
            request_id=user,
            long_term=long_term,
            short_term=_sequence(short_term, rng),
            candidate_item_ids=rng.integers(0, 10**6, candidates).tolist(),
            relay_instance=instance,
        )
        pairs.append(Pair(pre.SerializeToString(), rank.SerializeToString()))
    return pairs


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field's encoding."""
    tag, size, out = (number << 3) | 2, len(payload), bytearray()
    for value in (tag, size):
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out) + payload


def batch_bytes(pre_infers: Sequence[bytes]) -> bytes:
    """A PreInferBatchRequest of already serialized PreInferRequests, without parsing them."""
    return b"".join(_field(1, request) for request in pre_infers)


def admit_bytes(pre_infer: bytes, short_term: int, candidates: int) -> bytes:
    """The Admit of a serialized PreInferRequest: the contract's fields 1 and 2 are the same, and the
    Admit-only ones are appended (protobuf merges concatenated messages)."""
    extra = trigger_pb2.AdmitRequest(num_candidates=candidates, short_term_length=short_term)
    return pre_infer + extra.SerializeToString()


async def open_loop(count: int, rate: float, send: Callable[[int, float], Awaitable]) -> float:
    """`send(i, at)` for each i < `count`, started at its intended time `at` (the loop's clock), one every
    1/`rate` s whatever the answers (0: each once the one before is answered, closed loop). Returns the
    seconds from the first intended time to the last answer."""
    loop = asyncio.get_running_loop()
    start, pending = loop.time() + (LEAD_S if rate else 0.0), []
    for i in range(count):
        if not rate:
            await send(i, loop.time())
            continue
        at = start + i / rate
        await asyncio.sleep(max(0.0, at - loop.time()))
        pending.append(asyncio.ensure_future(send(i, at)))
    await asyncio.gather(*pending)
    return loop.time() - start


@dataclasses.dataclass
class Answers:
    latency_ms: list[float] = dataclasses.field(default_factory=list)  # the Ranks' (PreInfers' alone)
    sources: dict[str, int] = dataclasses.field(default_factory=dict)  # the Ranks' (PreInfers': outcomes)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    wall_s: float = 0.0  # from the first intended send to the last answer
    admit_ms: list[float] = dataclasses.field(default_factory=list)  # through a trigger: each Admit's
    ready: int = 0  # Ranks whose prefix was ready in HBM (no wait for a production)
    calls: int = 0  # PreInfer or PreInferBatch calls sent (alone or batched)

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


@dataclasses.dataclass(frozen=True)
class Via:
    """How a run's pairs travel: each PreInfer alone, then its Rank (the default); with `window_s`, the
    PreInfers within each window as one PreInferBatch, the Ranks on their own clock; with `trigger`, each
    PreInfer an Admit to that trigger, which fires it. `pre_infers_only` and `ranks_only` send one half of
    the pairs (windowed as `window_s` says)."""

    window_s: float = 0.0
    trigger: str = ""
    pre_infers_only: bool = False
    ranks_only: bool = False

    @property
    def windowed(self) -> bool:
        return bool(self.window_s or self.pre_infers_only or self.ranks_only)


SINGLE = Via()


def windows(count: int, rate: float, window_s: float) -> dict[int, tuple[float, list[int]]]:
    """The pairs whose PreInfers go together, by the index of their window's first: (the window's send time
    from the start, their indices). A window holds the PreInfers within `window_s` of its first and is sent
    that long after it (no window: each alone, at once); one that fills to `BATCH_MAX` is sent when its
    last one arrives, as the trigger's coalescer sends a full batch."""
    found: dict[int, tuple[float, list[int]]] = {}
    first = 0
    for i in range(count):
        at = i / rate
        if not found or at >= first / rate + window_s or len(found[first][1]) == BATCH_MAX:
            first = i
            found[i] = (at + window_s, [])
        found[first][1].append(i)
        if len(found[first][1]) == BATCH_MAX:
            found[first] = (at, found[first][1])
    return found


class Driver:
    """Pairs at rankers over grpc.aio, requests already serialized, sent as `via` says; with several
    addresses, pair i goes to the (i mod K)-th (its relay hint must name that ranker)."""

    def __init__(self, *addresses: str, via: Via = SINGLE) -> None:
        self.via = via
        self.channels = [grpc.aio.insecure_channel(address) for address in addresses]
        self.rankers = [
            {name: channel.unary_unary(f"/{RANKER_SERVICE}/{name}", response_deserializer=answer.FromString)
             for name, answer in RANKER_CALLS.items()}
            for channel in self.channels
        ]  # fmt: skip
        if via.trigger:
            self.channels.append(grpc.aio.insecure_channel(via.trigger))
            self.admit = self.channels[-1].unary_unary(
                f"/{TRIGGER_SERVICE}/Admit", response_deserializer=trigger_pb2.AdmitResponse.FromString
            )

    async def run(self, pairs: Sequence[Pair], rate: float, delay_s: float) -> Answers:
        """`pairs` one every 1/`rate` s (0: one after the other), each Rank `delay_s` after its PreInfer's
        intended time (and, its PreInfer sent alone or as an Admit, after its answer)."""
        answers, via, loop = Answers(), self.via, asyncio.get_running_loop()
        groups = windows(len(pairs), rate, via.window_s) if via.windowed and not via.ranks_only else {}
        if via.trigger:  # every pair of a run has the same sizes: the Admits are built from the first Rank's
            rank = ranker_pb2.RankRequest.FromString(pairs[0].rank)
            sizes = (len(rank.short_term.item_ids), len(rank.candidate_item_ids))
            admits = [admit_bytes(p.pre_infer, *sizes) for p in pairs]

        async def send(i: int, at: float) -> None:
            ranker = self.rankers[i % len(self.rankers)]
            try:
                if via.trigger:
                    await self.admit(admits[i], timeout=RPC_TIMEOUT_S)
                    answers.admit_ms.append((loop.time() - at) * 1000)
                elif not via.windowed:
                    answers.calls += 1
                    await ranker["PreInfer"](pairs[i].pre_infer, timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                answers.count(answers.errors, f"{'Admit' if via.trigger else 'PreInfer'} {error.code().name}")
            sends = [] if via.pre_infers_only else [self._rank(ranker, pairs[i].rank, at + delay_s, answers)]
            if i in groups:
                window_at, group = groups[i]
                window = [pairs[j].pre_infer for j in group]
                sends.append(self._window(ranker, window, at - i / rate + window_at, answers))
            await asyncio.gather(*sends)

        answers.wall_s = await open_loop(len(pairs), rate, send)
        return answers

    async def _rank(self, ranker: dict, rank: bytes, rank_at: float, answers: Answers) -> None:
        """A Rank sent at `rank_at`: its latency from then, its prefix's source, whether it was ready."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, rank_at - loop.time()))
        try:
            answer = await ranker["Rank"](rank, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"Rank {error.code().name}")
            return
        answers.latency_ms.append((loop.time() - rank_at) * 1000)
        source = common_pb2.CacheSource.Name(answer.cache_source)
        answers.count(answers.sources, source)
        answers.ready += source == HBM and answer.prefix_wait_ms < READY_MS

    async def _window(self, ranker: dict, group: list[bytes], send_at: float, answers: Answers) -> None:
        """A window's PreInfers at `send_at`: one alone, or one PreInferBatch."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, send_at - loop.time()))
        answers.calls += 1
        try:
            if len(group) == 1:
                outcomes = [(await ranker["PreInfer"](group[0], timeout=RPC_TIMEOUT_S)).outcome]
            else:
                batch = await ranker["PreInferBatch"](batch_bytes(group), timeout=RPC_TIMEOUT_S)
                outcomes = [answer.outcome for answer in batch.answers]
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"PreInfer {error.code().name}")
            return
        if self.via.pre_infers_only:  # their latency and outcomes are the run's answers
            took_ms = (loop.time() - send_at) * 1000
            for outcome in outcomes:
                answers.latency_ms.append(took_ms)
                answers.count(answers.sources, ranker_pb2.PreInferOutcome.Name(outcome))

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
